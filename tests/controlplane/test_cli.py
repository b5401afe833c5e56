"""`qshare claims|nodes|gpus`: the people's CLI over a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import re
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.cli import EXIT_BROKEN_PIPE, main
from qshare.contracts.schema import preemptions
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.testing.servers import free_port
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, Register, as_identity


@pytest.fixture(scope="module")
async def api_url(
    database_url: str, bus_url: str, replicas: object, nats_auth: NatsAuth
) -> AsyncIterator[str]:
    port = free_port()
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, port=port, cluster=RULES,
        bootstrap_admin_token=ADMIN_TOKEN, **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(create_app(settings), port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


async def _qshare(url: str, *args: str) -> int:
    """Run the CLI in a thread: it is synchronous and the server shares this event loop."""
    group, *rest = args
    argv = [group, "--url", url, "--token", ADMIN_TOKEN, *rest]
    return await asyncio.to_thread(main, argv)


async def test_the_cli_creates_a_claim_and_shows_where_it_went(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1")
    args = ("--priority", "high", "--vcore", "30", "--vmemory", "2Gi")
    assert await _qshare(api_url, "claims", "create", *args) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["ID", "TENANT", "STATUS", "PRIO"]
    assert row.split()[2:] == ["placed", "high", "30%", "2", "GiB", "1", "n1", "0"]


async def test_the_cli_lists_cards_with_their_free_capacity(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1", cards=2)
    assert await _qshare(api_url, "gpus", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NODE", "IDX", "UUID", "MODEL", "HEALTHY", "VGPUS", "MEMORY",
                                "FREE", "HIGH_FREE", "LOW_FREE"]  # fmt: skip
    assert [line.split()[:3] for line in lines[1:]] == [["n1", "0", "n1-g0"], ["n1", "1", "n1-g1"]]


async def test_the_cli_reports_a_problem_and_exits_1(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--priority", "high", "--vcore", "0", "--vmemory", "2Gi")
    assert await _qshare(api_url, "claims", "create", *args) == 1
    assert "vcore:" in capsys.readouterr().err


def test_an_unreachable_api_is_named_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["claims", "--url", url, "--token", "t", "list"]) == 2
    assert f"cannot reach the qshare API at {url}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid port"),
        ("http://api:port", "Invalid port"),
        ("http://127.0.0.1:99999", "port 99999 is not in 1-65535"),
        ("127.0.0.1:8080", "not an http:// or https:// URL"),
        ("", "not an http:// or https:// URL"),
        ("http://", "names no host"),
    ],
)
def test_a_url_that_is_no_url_is_named_with_where_it_came_from_and_exits_2(
    url: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["claims", "--url", url, "--token", "t", "list"]) == 2
    err = capsys.readouterr().err
    assert f"the API URL {url!r} (--url or $QSHARE_URL)" in err and why in err
    assert "Traceback" not in err and "cannot reach" not in err


@pytest.mark.parametrize(
    ("token", "what"),
    [
        ("qs_é", "a character that is not ASCII (character 4)"),
        ("qs_a\nb", "a control character (character 5)"),
    ],
)
def test_a_token_a_header_cannot_carry_is_named_without_showing_it_and_exits_2(
    token: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["claims", "--url", url, "--token", token, "list"]) == 2
    err = capsys.readouterr().err
    assert "the token (--token or $QSHARE_TOKEN) holds" in err and what in err
    assert token not in err and "Traceback" not in err and "cannot reach" not in err


@contextlib.contextmanager
def _answering(status: int, body: bytes) -> Iterator[str]:
    """A web server that is not qshare's API: every GET gets `status` and `body` (HTML)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_answering_something_not_json_is_named_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _answering(200, b"<html>sign in</html>") as url:
        assert main(["claims", "--url", url, "--token", "t", "list"]) == 2
    err = capsys.readouterr().err
    assert "answered 200 with something that is not JSON (text/html" in err
    assert "is the URL qshare's API?" in err


def test_an_error_whose_body_is_json_but_no_problem_shows_the_body_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _answering(502, b'["bad gateway"]') as url:
        assert main(["claims", "--url", url, "--token", "t", "list"]) == 1
    assert 'error 502: ["bad gateway"]' in capsys.readouterr().err


async def _create(url: str, *extra: str) -> int:
    args = ("--priority", "high", "--vcore", "10", "--vmemory", "1Gi")
    return await _qshare(url, "claims", "create", *args, *extra)


async def test_listing_pages_with_the_cursor_it_suggests(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    for _ in range(3):
        assert await _create(api_url) == 0
    capsys.readouterr()
    assert await _qshare(api_url, "claims", "list", "--limit", "2") == 0
    cursor = capsys.readouterr().out.rsplit("--cursor ", 1)[1].rstrip(")\n")
    assert await _qshare(api_url, "claims", "list", "--limit", "2", "--cursor", cursor) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # the header and the third claim


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--selector", "zone"), "'zone' is not KEY=VALUE"),
        (("--selector", "zone=a", "--selector", "zone=b"), "--selector repeats zone"),
        (("--vmemory", "4G"), "did you mean 4Gi?"),
        (("--vmemory", "-4Gi"), "-4Gi"),
    ],
)
async def test_bad_create_arguments_are_named_before_anything_is_sent(
    api_url: str, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str
) -> None:
    with contextlib.suppress(SystemExit):
        assert await _create(api_url, *extra) != 0
    assert message in capsys.readouterr().err


async def test_an_empty_claim_id_is_named_not_a_traceback(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        await _qshare(api_url, "claims", "get", "")
    assert "'' is not a claim id" in capsys.readouterr().err


async def test_an_error_is_printed_once_without_the_validator_prefix(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "claims", "create", "--priority", "high", "--vcore", "0",
                         "--vmemory", "1Gi") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("vcore") == 1 and "Value error" not in err


async def test_get_shows_the_vgpus_and_json_output_is_the_claim(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1")
    assert await _qshare(api_url, "claims", "-o", "json", "create", "--priority", "high",
                         "--vcore", "10", "--vmemory", "1Gi") == 0  # fmt: skip
    created = json.loads(capsys.readouterr().out)
    assert created["idempotency_key"].startswith("cli-")
    assert await _qshare(api_url, "claims", "get", created["id"]) == 0
    assert created["vgpus"][0]["id"] in capsys.readouterr().out


async def test_connection_and_output_options_may_follow_the_verb(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1")
    argv = ["gpus", "list", "--url", api_url, "--token", ADMIN_TOKEN, "-o", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    assert [card["node"] for card in json.loads(capsys.readouterr().out)] == ["n1"]


async def test_an_option_given_after_the_verb_wins_over_the_same_before_it(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    await register("n1")
    argv = ["gpus", "--url", api_url, "-o", "yaml", "list", "--token", ADMIN_TOKEN, "-o", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    json.loads(capsys.readouterr().out)


def test_a_wait_timeout_out_of_range_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["claims", "wait", "00000000-0000-0000-0000-000000000001", "--timeout", "-1"])
    assert "'-1' is not a number of seconds" in capsys.readouterr().err


async def _json(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> object:
    group, *rest = args
    assert await _qshare(url, group, "-o", "json", *rest) == 0
    return json.loads(capsys.readouterr().out)


async def test_an_issued_token_works_for_its_tenant_until_it_is_revoked(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    issued = await _json(api_url, capsys, "tokens", "create", "--name", "ci", "--tenant", "t-cli")
    assert isinstance(issued, dict)
    as_tenant = ["claims", "list", "--url", api_url, "--token", issued["token"]]
    assert await asyncio.to_thread(main, as_tenant) == 0
    assert await _qshare(api_url, "tokens", "revoke", issued["id"]) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, as_tenant) == 1
    assert "401" in capsys.readouterr().err


async def test_tokens_create_shows_when_the_token_was_created(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "tokens", "create", "--name", "c", "--tenant", "t-c") == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    created = row[header.index("CREATED") :].split()[:2]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", " ".join(created)), row


async def test_the_token_list_never_shows_a_secret(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    issued = await _json(api_url, capsys, "tokens", "create", "--name", "x", "--tenant", "t-x")
    assert isinstance(issued, dict)
    assert await _qshare(api_url, "tokens", "list") == 0
    out = capsys.readouterr().out
    assert issued["id"] in out and issued["token"] not in out


async def test_a_quota_set_from_the_cli_is_listed_and_cleared(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("quotas", "set", "t-q", "--memory", "64Gi", "--cards", "8")
    assert await _json(api_url, capsys, *args) == {
        "tenant": "t-q", "memory_mib": 65536, "cards": 8, "pending": None
    }  # fmt: skip
    assert await _qshare(api_url, "quotas", "list") == 0
    assert ["t-q", "64", "GiB", "8", "-"] in [
        line.split() for line in capsys.readouterr().out.splitlines()
    ]
    assert await _qshare(api_url, "quotas", "clear", "t-q") == 0
    assert capsys.readouterr().out.strip() == "quota of t-q cleared"
    quotas = await _json(api_url, capsys, "quotas", "list")
    assert isinstance(quotas, list) and "t-q" not in [q["tenant"] for q in quotas]


async def test_quotas_set_keeps_the_limits_it_is_not_given(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "quotas", "set", "t-k", "--memory", "8Gi", "--cards", "4") == 0
    capsys.readouterr()
    assert await _json(api_url, capsys, "quotas", "set", "t-k", "--pending", "2") == {
        "tenant": "t-k", "memory_mib": 8192, "cards": 4, "pending": 2
    }  # fmt: skip


async def test_quotas_set_none_removes_that_limit(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "quotas", "set", "t-r", "--memory", "8Gi", "--cards", "4") == 0
    capsys.readouterr()
    assert await _json(api_url, capsys, "quotas", "set", "t-r", "--cards", "none") == {
        "tenant": "t-r", "memory_mib": 8192, "cards": None, "pending": None
    }  # fmt: skip


async def test_quotas_set_none_of_a_tenant_without_a_quota_says_it_has_none(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "quotas", "set", "t-no", "--cards", "none") == 1
    assert "tenant t-no has no quota" in capsys.readouterr().err


async def test_quotas_set_without_a_limit_says_what_to_give(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "quotas", "set", "t-e") == 2
    assert "give at least one of --memory, --cards, --pending" in capsys.readouterr().err


async def test_a_reader_that_goes_away_ends_the_cli_quietly(
    api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qshare nodes list | head`: no BrokenPipeError traceback, SIGPIPE's exit status."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        assert await _qshare(api_url, "nodes", "list") == EXIT_BROKEN_PIPE
    finally:
        monkeypatch.undo()
        closed.close()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("tokens", "create", "--name", "n", "--tenant", "t", "--expires-in", "0"), "--expires-in"),
        (("claims", "create", "--priority", "low", "--vcore", "5", "--vmemory", "1Gi",
          "--class", "nope"), "--class"),
    ],
)  # fmt: skip
async def test_an_error_names_the_option_the_user_typed_not_the_api_field(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...], flag: str,
) -> None:  # fmt: skip
    await register("n1")
    assert await _qshare(api_url, *args) == 1
    err = capsys.readouterr().err
    assert f"  {flag}: " in err and "_s:" not in err and "class_name" not in err


async def test_a_missing_token_gets_a_hint_where_to_find_one(
    api_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QSHARE_TOKEN", raising=False)
    assert await asyncio.to_thread(main, ["nodes", "list", "--url", api_url]) == 1
    err = capsys.readouterr().err
    assert "401" in err and "--token or $QSHARE_TOKEN" in err


async def test_a_token_id_that_is_not_a_uuid_is_named_before_anything_is_sent(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        await _qshare(api_url, "tokens", "revoke", "123")
    assert "'123' is not a token id" in capsys.readouterr().err


async def test_a_claim_not_found_points_to_the_released_listing(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _qshare(api_url, "claims", "get", "00000000-0000-0000-0000-000000000009") == 1
    err = capsys.readouterr().err
    assert "error 404: claim 00000000-0000-0000-0000-000000000009 not found" in err
    assert "`qshare claims list --status released`" in err


@pytest.mark.parametrize("group", ["gpus", "claims"])
async def test_an_empty_listing_of_an_unknown_node_says_no_such_node_is_registered(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str], group: str
) -> None:
    await register("n1")
    assert await _qshare(api_url, group, "list", "--node", "n-typo") == 0
    assert "(no node n-typo is registered" in capsys.readouterr().out
    assert await _qshare(api_url, "claims", "list", "--node", "n1") == 0
    assert "no node" not in capsys.readouterr().out


@pytest.mark.parametrize("tenant", ["team?a", "team#a", "org/team", "..", "%2e%2e"])
async def test_a_quota_reaches_the_tenant_named_whatever_characters_its_name_holds(
    api_url: str, capsys: pytest.CaptureFixture[str], tenant: str
) -> None:
    """A tenant's name is one path segment: before, `team?a` set the quota of `team`,
    `%2e%2e` that of `..`, and `org/team` and `..` were 404 (a token may name any of them)."""
    quota = await _json(api_url, capsys, "quotas", "set", tenant, "--cards", "3")
    assert isinstance(quota, dict) and quota["tenant"] == tenant
    listed = await _json(api_url, capsys, "quotas", "list")
    assert isinstance(listed, list)
    assert [q["tenant"] for q in listed if q["cards"] == 3] == [tenant]
    assert await _qshare(api_url, "quotas", "clear", tenant) == 0
    assert capsys.readouterr().out == f"quota of {tenant} cleared\n"
    assert await _json(api_url, capsys, "quotas", "list") == []


async def test_a_node_name_with_a_query_in_it_cordons_no_other_node(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `nodes cordon 'n1?x=1'` cordoned n1."""
    await register("n1")
    assert await _qshare(api_url, "nodes", "cordon", "n1?x=1") == 1
    assert "422" in capsys.readouterr().err
    nodes = await _json(api_url, capsys, "nodes", "list")
    assert isinstance(nodes, list) and [n["schedulable"] for n in nodes] == [True]


@pytest.mark.parametrize(
    "args",
    [
        ("nodes", "cordon", ""),
        ("nodes", "uncordon", " "),
        ("quotas", "set", "", "--cards", "1"),
        ("quotas", "clear", ""),
        ("gpus", "get", ""),
        ("gpus", "share", "", "--policy", "fixed-share"),
        ("gpus", "reset-sharing", ""),
    ],
)
async def test_an_empty_name_is_named_before_anything_is_sent(
    api_url: str, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """Before, an empty name asked for the collection (`/v1/nodes/`), whose redirect ended
    in a traceback, or `quotas clear ''` said a quota was cleared."""
    with pytest.raises(SystemExit) as stopped:
        await _qshare(api_url, *args)
    assert stopped.value.code == 2
    assert "is empty: give a name" in capsys.readouterr().err


def test_a_redirect_is_named_not_taken_for_an_empty_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _answering(307, b"") as url:
        assert main(["claims", "--url", url, "--token", "t", "list"]) == 2
    err = capsys.readouterr().err
    assert "answered 307" in err and "is the URL qshare's API?" in err


def test_a_token_whose_answer_was_lost_is_not_issued_a_second_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A lost answer to `tokens create` may still have issued the token, and its secret
    cannot be sent again: the CLI says so instead of sending the request again. Before, it
    sent it twice (as it does for claims, which the idempotency key makes safe) and left a
    live token whose secret nobody ever saw."""
    posts = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            if len(posts) == 1:
                self.close_connection = True  # issued, but the answer never leaves
                return
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            token = {"id": "i", "name": "n", "tenant": "t", "role": "tenant", "scope": "write",
                     "created_at": None, "expires_at": None, "token": "qs_x"}  # fmt: skip
            self.wfile.write(json.dumps(token).encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        argv = ["tokens", "--url", url, "--token", "t", "create", "--name", "n", "--tenant", "t"]
        assert main(argv) == 2
    finally:
        server.shutdown()
        server.server_close()
    assert posts == ["/v1/tokens"]
    err = capsys.readouterr().err
    assert "may have been issued" in err and "qshare tokens list" in err


async def test_a_full_page_of_preemptions_says_how_to_list_the_older_ones(
    api_url: str, engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = uuid.uuid4()
    rows = [{"claim_id": claim, "tenant": "t-p", "kind": "operator", "reason": f"r{i}"}
            for i in range(3)]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(preemptions), rows)
    args = ("preemptions", "list", "--claim", str(claim), "--limit", "2")
    assert await _qshare(api_url, *args) == 0
    more = re.search(r"\(more: --before (\d+)\)", capsys.readouterr().out)
    assert more is not None
    assert await _qshare(api_url, *args, "--before", more[1]) == 0
    out = capsys.readouterr().out
    assert "r0" in out and "r1" not in out and "r2" not in out and "more:" not in out


async def test_a_url_below_the_apis_root_is_named_as_such(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`QSHARE_URL=http://host:8080/v1` (the routes start with /v1): before, the CLI said only
    `error 404: Not Found`."""
    assert await _qshare(f"{api_url}/v1", "claims", "list") == 1
    err = capsys.readouterr().err
    assert "no route GET /v1/v1/claims" in err and "the API's root URL" in err


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "[::1"])
def test_a_password_in_the_url_is_never_printed(
    capsys: pytest.CaptureFixture[str], host: str
) -> None:
    url = "http://me:s3cret@" + host.format(port=free_port())
    assert main(["claims", "--url", url, "--token", "t", "list"]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "me:***@" in err


async def test_a_claim_created_from_the_cli_may_join_a_gang(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API takes `gang` (claims suspended and resumed together); the CLI had no way to
    give it."""
    await register("n1", cards=2)
    args = ("--priority", "low", "--vcore", "10", "--vmemory", "1Gi", "--gang", "train-7")
    claim = await _json(api_url, capsys, "claims", "create", *args)
    assert isinstance(claim, dict) and claim["gang"] == "train-7"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("claims", "create", "--priority", "high", "--vcore", "101", "--vmemory", "1Gi"),
         "  --vcore: must be at most 100"),
        (("claims", "create", "--priority", "high", "--vcore", "5", "--vmemory", "1Gi",
          "--count", "0"), "  --count: must be at least 1"),
        (("quotas", "set", "t" * 300, "--cards", "1"), "  TENANT: must have at most"),
    ],
)  # fmt: skip
async def test_an_api_error_names_the_option_typed_in_the_clis_words(
    api_url: str, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], line: str
) -> None:
    """Before, `vcore: Input should be less than or equal to 100`: the API's field and
    pydantic's wording, where `--class` errors named the option."""
    assert await _qshare(api_url, *args) == 1
    err = capsys.readouterr().err
    assert line in err and "should" not in err, err


async def test_quotas_set_none_of_a_tenant_without_a_quota_says_so_in_the_clis_terms(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `a PATCH that sets no limit changes none`, the REST call the user never made."""
    assert await _qshare(api_url, "quotas", "set", "t-none", "--cards", "none") == 1
    err = capsys.readouterr().err
    assert "tenant t-none has no quota, so --cards none has no limit to remove" in err
    assert "PATCH" not in err and "qshare quotas set t-none --cards 8" in err


async def test_nodes_get_shows_one_node(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    """`GET /v1/nodes/{name}` had no command: only `nodes list` showed a node."""
    await register("n1", cards=2)
    assert await _qshare(api_url, "nodes", "get", "n1") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["NAME", "STATUS", "GPUS"] and row.split()[:3] == [
        "n1",
        "Ready",
        "2",
    ]
    assert await _qshare(api_url, "nodes", "get", "n9") == 1
    assert "n9" in capsys.readouterr().err


async def test_nodes_delete_removes_a_node_or_one_card_and_names_the_claims_it_failed(
    api_url: str, register: Register, capsys: pytest.CaptureFixture[str]
) -> None:
    """`DELETE /v1/nodes/{name}` and `/v1/nodes/{name}/gpus/{uuid}` (a decommissioned node or
    card) were REST only."""
    await register("n1", cards=2)
    assert await _create(api_url, "-o", "json") == 0
    created = json.loads(capsys.readouterr().out)
    free = {"n1-g0", "n1-g1"} - {created["vgpus"][0]["gpu"]}
    assert await _qshare(api_url, "nodes", "delete", "n1", "--card", *free) == 0
    assert (
        capsys.readouterr().out.strip() == f"card {free.pop()} of node n1 removed; no claim held it"
    )
    assert await _qshare(api_url, "nodes", "delete", "n1") == 0
    assert capsys.readouterr().out.strip() == f"node n1 removed; claims now failed: {created['id']}"
    await register("n2")
    nodes = await _json(api_url, capsys, "nodes", "list")
    assert isinstance(nodes, list) and [n["name"] for n in nodes] == ["n2"]
    assert await _qshare(api_url, "nodes", "delete", "n1") == 1
    assert "n1" in capsys.readouterr().err
