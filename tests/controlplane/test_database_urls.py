"""Database URLs as psql and hosting providers write them (`postgres://`, `postgresql://`) are
read by every service and turned into the asyncpg form; anything else is refused naming the
variable, without its password."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from pydantic_settings import BaseSettings
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.dburl import normalised
from qshare.envsettings import SettingsError, load
from qshare.testing.servers import free_port
from qshare_allocator.__main__ import main as allocator
from qshare_allocator.settings import AllocatorSettings
from qshare_api.__main__ import main as api
from qshare_api.settings import ApiSettings
from qshare_preemptor.settings import PreemptorSettings

SETTINGS = [
    (AllocatorSettings, "QSHARE_ALLOCATOR_DATABASE_URL"),
    (ApiSettings, "QSHARE_API_DATABASE_URL"),
    (PreemptorSettings, "QSHARE_PREEMPTOR_DATABASE_URL"),
]


@pytest.fixture(autouse=True)
def no_pgport(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default port is libpq's 5432 here, whatever the shell running the tests sets."""
    monkeypatch.delenv("PGPORT", raising=False)


def refusal(monkeypatch: pytest.MonkeyPatch, url: str) -> str:
    """The one line the API's settings refuse `url` with, as QSHARE_API_DATABASE_URL."""
    monkeypatch.setenv("QSHARE_API_DATABASE_URL", url)
    with pytest.raises(SettingsError) as refused:
        load(ApiSettings)
    (line,) = refused.value.problems
    return line


async def select_one(url: str) -> object:
    """`SELECT 1` over a connection made with `url` (the services' asyncpg form)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.scalar(text("SELECT 1"))
    finally:
        await engine.dispose()


@pytest.mark.parametrize(("cls", "variable"), SETTINGS)
@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+asyncpg"])
def test_every_service_reads_a_postgres_url_in_the_asyncpg_form(
    monkeypatch: pytest.MonkeyPatch, cls: type[BaseSettings], variable: str, scheme: str
) -> None:
    monkeypatch.setenv(variable, f"{scheme}://qshare:p%40ss@db.example:6543/qshare")
    found = load(cls).database_url  # type: ignore[attr-defined]
    assert found == "postgresql+asyncpg://qshare:p%40ss@db.example:6543/qshare"


def test_libpqs_sslmode_becomes_asyncpgs_ssl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_API_DATABASE_URL", "postgres://u:p@db/q?sslmode=require")
    assert load(ApiSettings).database_url == "postgresql+asyncpg://u:p@db/q?ssl=require"


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("mysql://qshare:hush@db/qshare",
         "qshare api: QSHARE_API_DATABASE_URL='mysql://qshare:***@db/qshare': mysql:// is not "
         "a Postgres URL; the form is postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
         "(postgres:// and postgresql+asyncpg:// are read too)"),
        ("db.example:5432",
         "qshare api: QSHARE_API_DATABASE_URL='db.example:5432': not a database URL; the form "
         "is postgresql://USER:PASSWORD@HOST:PORT/DATABASE (postgres:// and "
         "postgresql+asyncpg:// are read too)"),
    ],
)  # fmt: skip
def test_a_url_that_is_not_postgres_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, line: str
) -> None:
    monkeypatch.setenv("QSHARE_API_DATABASE_URL", value)
    assert api([]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_the_allocator_migrates_through_a_postgres_url(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    scheme, _, rest = database_url.partition("://")
    assert scheme == "postgresql+asyncpg"
    monkeypatch.setenv("QSHARE_ALLOCATOR_DATABASE_URL", f"postgres://{rest}")
    assert allocator(["migrate"]) == 0


@pytest.mark.parametrize("option", ["connect_timeout=10", "application_name=qs", "options=-c"])
def test_a_libpq_option_asyncpg_cannot_take_is_refused_at_start_naming_it(
    monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    line = refusal(monkeypatch, f"postgres://u:hush@db/q?{option}")
    assert line.startswith("QSHARE_API_DATABASE_URL=")
    assert f"?{option.partition('=')[0]}=" in line and "hush" not in line


def test_both_sslmode_and_ssl_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_API_DATABASE_URL", "postgres://u:p@db/q?sslmode=require&ssl=true")
    with pytest.raises(SettingsError, match="sslmode"):
        load(ApiSettings)


@pytest.mark.parametrize(
    "query", ["", "&sslmode=disable", "&target_session_attrs=read-write", "&ssl=disable"]
)
async def test_options_asyncpg_takes_connect(database_url: str, query: str) -> None:
    _, _, rest = database_url.partition("://")
    assert "?host=" in rest  # the test server listens on a unix socket: ?host=/its/dir
    assert await select_one(normalised(f"postgres://{rest}{query}")) == 1


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("postgres://u:p@[::1]:5432/q", "postgresql+asyncpg://u:p@[::1]:5432/q"),
        ("postgres://u:p%40s%3As%2F%23@h/q", "postgresql+asyncpg://u:p%40s%3As%2F%23@h/q"),
        ("postgres://u@/q?host=/var/run/postgresql",
         "postgresql+asyncpg://u@/q?host=%2Fvar%2Frun%2Fpostgresql"),
    ],
)  # fmt: skip
def test_ipv6_hosts_quoted_passwords_and_socket_directories_are_kept(url: str, form: str) -> None:
    assert normalised(url) == form
    assert make_url(normalised(url)).password == make_url(url).password


@pytest.mark.parametrize(
    "value",
    [
        "mysql://qshare:pw1@pw2@db/qshare",  # an '@' in the password, not percent-encoded
        "postgres://qshare:pw1@pw2@db/qshare?connect_timeout=3",
        "qshare:pw1@db/qshare",  # no scheme
        "host=db user=qshare password=pw1 dbname=qshare",  # libpq's keyword form
        "mysql://db/qshare?password=pw1",
    ],
)
def test_a_refused_url_never_shows_any_of_its_password(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    line = refusal(monkeypatch, value)
    assert line.startswith("QSHARE_API_DATABASE_URL=")
    assert "pw" not in line, line


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("postgresql://u:p@h1:5432,h2:5433/db",
         "postgresql+asyncpg://u:p@/db?host=h1%3A5432&host=h2%3A5433"),
        ("postgres://u:p@h1,h2:5433/db?sslmode=require",
         "postgresql+asyncpg://u:p@/db?host=h1%3A5432&host=h2%3A5433&ssl=require"),
        ("postgres://u@db-a.example:6000,%2Frun%2Fpg:5432/db",
         "postgresql+asyncpg://u@/db?host=db-a.example%3A6000&host=%2Frun%2Fpg%3A5432"),
        ("postgresql+asyncpg://u:p@h1:5432,h2:5433/db",
         "postgresql+asyncpg://u:p@/db?host=h1%3A5432&host=h2%3A5433"),
        ("postgres://u:p%40%2C%3A%2F@h1,h2/db",
         "postgresql+asyncpg://u:p%40%2C%3A%2F@/db?host=h1%3A5432&host=h2%3A5432"),
    ],
)  # fmt: skip
def test_libpqs_several_hosts_become_asyncpgs_host_options(url: str, form: str) -> None:
    """libpq's failover form (a host without a port is on 5432, as libpq has it) becomes the
    repeated `?host=HOST:PORT` SQLAlchemy's asyncpg dialect takes."""
    assert normalised(url) == form


def test_a_host_without_a_port_among_several_is_on_pgport_as_libpq_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPORT", "6543")
    assert normalised("postgres://u:p@h1,h2:5433/db") == (
        "postgresql+asyncpg://u:p@/db?host=h1%3A6543&host=h2%3A5433"
    )


def test_a_pgport_that_is_not_a_port_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPORT", "70000")
    line = refusal(monkeypatch, "postgres://u:pw1@h1,h2/db")
    assert "PGPORT" in line and "pw1" not in line, line


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgres://u:pw1@h1:5432,[::1]:5433/db", "IPv6"),
        ("postgres://u:pw1@h1,h2/db?host=h3:5432", "?host="),
        ("postgres://u:pw1@h1,h2/db?port=5432", "?port="),
        ("postgres://u:pw1@h1:x,h2/db", "'x' is not a port"),
        ("postgres://u:pw1@h1,,h2/db", "an empty host"),
    ],
)  # fmt: skip
def test_several_hosts_asyncpg_cannot_take_are_refused_saying_why(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    line = refusal(monkeypatch, url)
    assert problem in line and "pw1" not in line, line


def _server(database_url: str) -> tuple[str, str, int, str]:
    """The test server's `user[:password]` and socket directory (percent-encoded), port and
    database."""
    url = make_url(database_url)
    password = f":{quote(url.password, safe='')}" if url.password else ""
    socket_dir = quote(str(url.query["host"]), safe="")
    return f"{url.username}{password}", socket_dir, url.port or 5432, str(url.database)


def _failover_url(database_url: str) -> str:
    """The test server's URL in libpq's several-hosts form: first a local port nothing
    listens on, then the server's socket directory."""
    user, socket_dir, port, database = _server(database_url)
    return f"postgresql://{user}@127.0.0.1:{free_port()},{socket_dir}:{port}/{database}"


async def test_a_service_connects_to_the_host_that_answers_of_several(database_url: str) -> None:
    assert await select_one(load_url(_failover_url(database_url))) == 1


def test_the_allocator_migrates_through_several_hosts(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    monkeypatch.setenv("QSHARE_ALLOCATOR_DATABASE_URL", _failover_url(database_url))
    assert allocator(["migrate"]) == 0


def load_url(url: str) -> str:
    """`url` as the preemptor's settings hold it."""
    return PreemptorSettings(database_url=url).database_url


@pytest.mark.parametrize(
    "hosts", ["h1:5432,h2:5433", "db.example:6543"], ids=["several hosts", "one host"]
)
def test_a_password_with_slash_question_hash_comma_or_colon_is_read_whole(hosts: str) -> None:
    """Not percent-encoded, as SQLAlchemy reads it with one host (base64 passwords hold '/'):
    with several hosts too, the password is everything between the first ':' and the '@'."""
    password = "pw,1/x?y#z:w"
    url = make_url(normalised(f"postgres://u:{password}@{hosts}/db"))
    assert (url.username, url.password, url.database) == ("u", password, "db")


@pytest.mark.parametrize("hosts", ["h1,h2:5433", "h1"], ids=["several hosts", "one host"])
def test_a_user_name_holding_an_at_is_read_as_sqlalchemy_reads_it(hosts: str) -> None:
    """Some hosting providers name users `user@server`; SQLAlchemy reads the name up to the
    password's ':' (percent-encoding it is the portable form)."""
    url = make_url(normalised(f"postgres://user@server:pw@{hosts}/db"))
    assert (url.username, url.password) == ("user@server", "pw")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgres://u:pw1@pw2@h1,h2/db", "'@'"),
        ("postgres://u:pw1@pw2@db/q", "'@'"),
        ("postgres://u:pw1@h1:99999,h2/db", "port 99999 of host h1"),
        ("postgres://u:pw1@h1,h2:0/db", "port 0 of host h2"),
        ("postgres://u:pw1@db:70000/q", "port 70000 of host db"),
        ("postgres://u:pw1@db:0/q", "port 0 of host db"),
        ("postgres://u:pw1@h1:²,h2/db", "'²' is not a port"),
        ("postgres://u:pw1@/db?host=/run/pg&port=99999", "port 99999 of host /run/pg"),
        ("postgres://u:pw1@/db?host=h1,h2&port=5432,70000", "port 70000"),
        ("postgres://u:pw1@/db?host=h1:5432&host=h2:99999", "port 99999 of host h2"),
    ],
)  # fmt: skip
def test_an_unencoded_at_or_a_port_out_of_range_is_refused_at_start_saying_why(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    """Not at the first connection: asyncpg raises OverflowError for a port past 65535 (a
    traceback, not a service's one-line error) and takes port 0 for 5432."""
    line = refusal(monkeypatch, url)
    assert problem in line and "pw1" not in line and "pw2" not in line, line


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("postgres://u:p@/db?host=h1,h2",
         "postgresql+asyncpg://u:p@/db?host=h1%3A5432&host=h2%3A5432"),
        ("postgres://u:p@/db?host=h1,h2&port=6000",
         "postgresql+asyncpg://u:p@/db?host=h1%3A6000&host=h2%3A6000"),
        ("postgres://u:p@/db?host=h1,%2Frun%2Fpg&port=6000,5433",
         "postgresql+asyncpg://u:p@/db?host=h1%3A6000&host=%2Frun%2Fpg%3A5433"),
    ],
)  # fmt: skip
def test_libpqs_host_and_port_lists_become_asyncpgs_host_options(url: str, form: str) -> None:
    """libpq's `?host=h1,h2` (every host on 5432, or on the one `?port=` given, or each on
    its own of as many) would fail every connection as SQLAlchemy's asyncpg dialect reads it
    ("All ports are required", "number of hosts and ports don't match")."""
    assert normalised(url) == form


def test_host_and_port_lists_of_different_lengths_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = refusal(monkeypatch, "postgres://u:pw1@/db?host=a,b,c&port=1,2")
    assert "3 hosts and 2 ports" in line and "pw1" not in line, line


async def test_a_service_connects_through_libpqs_host_and_port_lists(database_url: str) -> None:
    user, socket_dir, port, database = _server(database_url)
    lists = f"host=127.0.0.1,{socket_dir}&port={free_port()},{port}"
    assert await select_one(load_url(f"postgresql://{user}@/{database}?{lists}")) == 1
