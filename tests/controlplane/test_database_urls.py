"""Database URLs as psql and hosting providers write them (`postgres://`, `postgresql://`) are
read by every service and turned into the asyncpg form; anything else is refused naming the
variable, without its password."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings

from qshare.envsettings import load
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
