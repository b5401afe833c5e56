# ruff: noqa: F811 (the fixture api_url, imported, is a parameter of the tests)
"""`qshare events watch`: each line opens with the event's sequence, `--after N` resumes
after it, and a connection cut mid-stream is resumed after the last event printed, so none
is lost or printed twice (the cut is a TCP relay between the CLI and the real API that
drops its connections)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import pytest
import yaml
from nats.aio.client import Client

from qshare.cli import main
from qshare_api import cli_events
from tests.controlplane.conftest import ADMIN_TOKEN
from tests.controlplane.test_cli import api_url  # noqa: F401 (the server the CLI calls)
from tests.controlplane.test_event_resume import kept

Capsys = pytest.CaptureFixture[str]


def _watch(url: str, subject: str, *args: str) -> int:
    argv = ["events", "--url", url, "--token", ADMIN_TOKEN, "watch", "--subject", subject]
    return main([*argv, *args])


async def test_after_resumes_and_each_line_opens_with_its_sequence(
    api_url: str, nc: Client, capsys: Capsys
) -> None:
    subject = f"qshare.evt.cliwatch.{uuid.uuid4().hex[:8]}"
    first, *rest = await kept(nc, subject, 3)
    args = ("--after", str(first), "--count", "2")
    assert await asyncio.to_thread(_watch, api_url, subject, *args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [str(s) for s in rest]
    assert all(subject in line for line in lines)


async def test_json_lines_carry_the_sequence(api_url: str, nc: Client, capsys: Capsys) -> None:
    subject = f"qshare.evt.cliwatch.{uuid.uuid4().hex[:8]}"
    first, second = await kept(nc, subject, 2)
    args = ("--after", str(first), "--count", "1", "-o", "json")
    assert await asyncio.to_thread(_watch, api_url, subject, *args) == 0
    assert json.loads(capsys.readouterr().out)["sequence"] == second


async def test_yaml_prints_each_envelope_as_a_yaml_document_with_its_sequence(
    api_url: str, nc: Client, capsys: Capsys
) -> None:
    """`-o yaml` is offered for every group; for events it printed the table's lines."""
    subject = f"qshare.evt.cliwatch.{uuid.uuid4().hex[:8]}"
    first, *rest = await kept(nc, subject, 3)
    args = ("--after", str(first), "--count", "2", "-o", "yaml")
    assert await asyncio.to_thread(_watch, api_url, subject, *args) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["sequence"] for d in documents] == rest
    assert all(d["specversion"] == "1.0" for d in documents)


def test_an_after_that_is_no_sequence_is_refused_naming_it(capsys: Capsys) -> None:
    with pytest.raises(SystemExit):
        main(["events", "--token", "t", "watch", "--after", "-1"])
    assert "--after" in capsys.readouterr().err


class Relay:
    """A TCP relay to the API whose connections can be cut, and which meanwhile closes the
    ones that come (as a restarting API or a broken network would)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.closed = False
        self.open: list[asyncio.StreamWriter] = []
        self.answered = asyncio.Event()  # the API's first bytes came: the stream is open

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.closed:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.open += [writer, up_writer]
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer, self.answered))

    def cut(self) -> None:
        for writer in self.open:
            writer.transport.abort()
        self.open.clear()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, came: asyncio.Event | None = None
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
            if came is not None:
                came.set()
    writer.transport.abort()


@contextlib.asynccontextmanager
async def relayed(api_url: str) -> AsyncIterator[tuple[str, Relay]]:
    relay = Relay(int(api_url.rsplit(":", 1)[1]))
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", relay
    finally:
        relay.cut()
        server.close()


async def _printed(capsys: Capsys, out: list[str], wanted: int) -> list[str]:
    async with asyncio.timeout(30):
        while len(out) < wanted:
            out.extend(capsys.readouterr().out.splitlines())
            await asyncio.sleep(0.05)
    return out


async def test_a_cut_stream_is_resumed_after_the_last_event_printed(
    api_url: str, nc: Client, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_events, "RETRY_DELAYS_S", (0.2, 0.2, 0.5, 1.0, 2.0))
    subject = f"qshare.evt.cliwatch.{uuid.uuid4().hex[:8]}"
    out: list[str] = []
    async with relayed(api_url) as (url, relay):
        watching = asyncio.create_task(asyncio.to_thread(_watch, url, subject, "--count", "4"))
        await asyncio.wait_for(relay.answered.wait(), 20)  # events from now on reach it
        sequences = await kept(nc, subject, 2)
        await _printed(capsys, out, 2)
        relay.closed = True  # the connection is cut, and the first attempts are refused
        relay.cut()
        sequences += await kept(nc, subject, 2)  # while no stream is open
        await asyncio.sleep(0.3)
        relay.closed = False
        assert await asyncio.wait_for(watching, 30) == 0
    lines = await _printed(capsys, out, 4)
    assert [line.split()[0] for line in lines] == [str(s) for s in sequences]
