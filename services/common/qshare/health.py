"""Liveness and readiness of the services that serve no HTTP of their own (the allocator, the
preemptor, the node agent): a small HTTP server on the service's own event loop answers
`GET /healthz` and `GET /readyz` with JSON naming every check and why one fails (200 when all
hold, 503 when one does not). That the loop answers at all is the first liveness check."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from qshare.envsettings import env_names

if TYPE_CHECKING:  # the node agent's settings import this module: it stays light
    from nats.aio.client import Client
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[str | None]]
"""One check: None when it holds, else why not, in one line."""
CHECK_TIMEOUT_S = 2.0
"""A check that has not answered in this long fails (a probe's timeout is longer)."""
READ_TIMEOUT_S = 5.0
HEAD_LIMIT = 8192
"""Bytes of a request's head; a longer one is answered 431."""
CLOSE_WAIT_S = 2.0
MAX_WAITING = 64
"""Connections whose request head has not come yet; a newer one closes the oldest of them,
so silent clients (slowloris) cannot pile up the service's file descriptors while the
kubelet's probe, which sends its head at once, is still served."""


class HealthSettings(BaseModel):
    """The health server's fields of a service's settings (with the service's env prefix)."""

    health_port: int = Field(
        0, ge=0, le=65535, description="serve /healthz and /readyz on this port; 0 = off"
    )
    health_host: str = Field(
        "127.0.0.1", description="address the health server binds (0.0.0.0 in containers)"
    )


class ListenError(OSError):
    """The health server could not listen; the message names the setting."""


class Verdict(BaseModel):
    """The body of /healthz and /readyz: every check, "ok" or why it fails."""

    status: str
    failing: list[str]
    checks: dict[str, str]


class Probes:
    """What a service's /healthz (`live`) and /readyz (`ready`) check. Readiness also waits
    for `serving()`, called once start-up is over; `stopping()` ends it again. Probes that
    come while a run of the same checks is under way share its verdict, so a burst of probes
    costs the database one connection of the service's pool, not one each."""

    def __init__(self) -> None:
        self.live: dict[str, Check] = {}
        self.ready: dict[str, Check] = {"serving": self._serving_check}
        self._state = "starting"
        self._live, self._ready = Shared(), Shared()

    def serving(self) -> None:
        self._state = "serving"

    def stopping(self) -> None:
        self._state = "stopping"

    async def _serving_check(self) -> str | None:
        return None if self._state == "serving" else self._state

    async def liveness(self) -> Verdict:
        return await self._live(lambda: judge(self.live, "live", "not live"))

    async def readiness(self) -> Verdict:
        return await self._ready(lambda: judge(self.ready, "ready", "not ready"))


class Shared:
    """One run of some checks at a time: a probe that comes while one is under way gets its
    verdict; one that goes away does not cancel the run the others wait for."""

    def __init__(self) -> None:
        self._run: asyncio.Future[Verdict] | None = None

    async def __call__(self, run: Callable[[], Awaitable[Verdict]]) -> Verdict:
        if self._run is None or self._run.done():
            self._run = asyncio.ensure_future(run())
        return await asyncio.shield(self._run)


async def judge(checks: dict[str, Check], good: str, bad: str) -> Verdict:
    """Run `checks` together, each bounded by CHECK_TIMEOUT_S; a check that raises fails."""
    reasons = await asyncio.gather(*(_bounded(check) for check in checks.values()))
    results = {name: reason or "ok" for name, reason in zip(checks, reasons, strict=True)}
    failing = [name for name, reason in zip(checks, reasons, strict=True) if reason]
    return Verdict(status=bad if failing else good, failing=failing, checks=results)


async def _bounded(check: Check) -> str | None:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            return await check()
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    except Exception as exc:
        return f"check failed: {one_line(exc)}"


def one_line(exc: BaseException) -> str:
    """`exc` as a short line: its type and the first line of its message."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0][:200]}" if message else type(exc).__name__


class HealthServer:
    """Serves `probes` on `host`:`port`; `setting` names the port's variable in errors."""

    def __init__(self, probes: Probes, host: str, port: int, setting: str) -> None:
        self.probes = probes
        self.host = host
        self._port = port
        self.setting = setting
        self._server: asyncio.Server | None = None
        self._waiting: dict[asyncio.StreamWriter, None] = {}
        """Connections waiting for their request head, oldest first."""

    @property
    def port(self) -> int:
        """The port it listens on."""
        assert self._server is not None, "health server not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve, self.host, self._port, limit=HEAD_LIMIT
            )
        except OSError as exc:
            raise ListenError(
                f"{self.setting}={self._port}: the health server cannot listen on "
                f"{self.host}:{self._port} ({exc.strerror or exc})"
            ) from exc
        log.info("health server on %s:%d (/healthz, /readyz)", self.host, self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), CLOSE_WAIT_S)
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._waiting[writer] = None
        if len(self._waiting) > MAX_WAITING:
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.close()  # its head read ends at the EOF this gives
        try:
            status, body, head_only = await self._answer(reader, writer)
            writer.write(response(status, body, head_only))
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or sent nothing in time: nobody to answer
        finally:
            writer.close()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[int, dict[str, Any], bool]:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return 431, {"error": f"request head over {HEAD_LIMIT} bytes"}, False
        finally:
            self._waiting.pop(writer, None)
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, {"error": "not an HTTP/1.x request line"}, False
        method, target = parts[0], parts[1].split("?", 1)[0]
        return await self._route(method, target)

    async def _route(self, method: str, path: str) -> tuple[int, dict[str, Any], bool]:
        probes = {"/healthz": self.probes.liveness, "/readyz": self.probes.readiness}
        if path not in probes:
            return 404, {"error": f"no {path}: this server answers /healthz and /readyz"}, False
        if method not in ("GET", "HEAD"):
            return 405, {"error": f"{method} {path}: only GET and HEAD"}, False
        verdict = await probes[path]()
        return (503 if verdict.failing else 200), verdict.model_dump(), method == "HEAD"


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 503: "Service Unavailable"}  # fmt: skip


def response(status: int, body: dict[str, Any], head_only: bool = False) -> bytes:
    """A complete HTTP/1.1 response with a JSON body; the connection closes after it."""
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else data)


async def serve(probes: Probes, settings: HealthSettings) -> HealthServer | None:
    """The health server of `settings` started, or None when its port is 0 (off)."""
    if not settings.health_port:
        return None
    setting = env_names(type(settings), "health_port")[0]  # type: ignore[arg-type]
    server = HealthServer(probes, settings.health_host, settings.health_port, setting)
    await server.start()
    return server


def nats_connected(connection: Callable[[], Client | None]) -> Check:
    """Ready: the connection is up."""

    async def check() -> str | None:
        nc = connection()
        if nc is None:
            return "not connected yet"
        if nc.is_closed:
            return "connection closed"
        if not nc.is_connected:
            return "disconnected; reconnecting"
        return None

    return check


def nats_not_closed(connection: Callable[[], Client | None]) -> Check:
    """Live: the connection is not closed for good (it reconnects forever, so a closed one is
    never coming back while the process runs)."""

    async def check() -> str | None:
        nc = connection()
        return "connection closed for good" if nc is not None and nc.is_closed else None

    return check


def tasks_running(tasks: Callable[[], Iterable[asyncio.Task[Any]]]) -> Check:
    """Live: none of the service's long-running tasks has ended."""

    async def check() -> str | None:
        ended = [_ended(task) for task in tasks() if task.done()]
        return "; ".join(ended) or None

    return check


def _ended(task: asyncio.Task[Any]) -> str:
    if task.cancelled():
        return f"task {task.get_name()} was cancelled"
    error = task.exception()
    return f"task {task.get_name()} ended" + (f": {one_line(error)}" if error else "")


def database_ready(engine: Callable[[], AsyncEngine | None], head: str | None = None) -> Check:
    """Ready: Postgres answers and the schema is migrated (to revision `head` when given)."""

    async def check() -> str | None:
        found = engine()
        if found is None:
            return "not connected yet"
        try:
            revision = await schema_revision(found)
        except Exception as exc:
            return f"unreachable: {one_line(exc)}"
        return schema_problem(revision, head)

    return check


async def schema_revision(engine: AsyncEngine) -> str | None:
    """The schema's Alembic revision; None when it was never migrated."""
    from sqlalchemy import text

    async with engine.connect() as conn:
        if not await conn.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL")):
            return None
        found = await conn.scalar(text("SELECT version_num FROM alembic_version LIMIT 1"))
        return None if found is None else str(found)


async def until_migrated(
    engine: AsyncEngine, again_s: float, on_error: Callable[[Exception], None] | None = None
) -> str:
    """Wait until the schema is migrated, looking every `again_s`; its revision. Postgres out
    of reach ends the wait with its error, or, given `on_error`, is told to it and waited out."""
    while True:
        try:
            revision = await schema_revision(engine)
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)
        else:
            if revision is not None:
                return revision
        await asyncio.sleep(again_s)


def schema_problem(revision: str | None, head: str | None) -> str | None:
    """Why a schema at `revision` does not serve code that needs `head` (None: any)."""
    if revision is None:
        return (
            "schema not migrated yet (`python -m qshare_allocator migrate`, the allocator's "
            "init container, creates it)"
        )
    if head is not None and revision != head:
        return f"schema at revision {revision}, not at this image's migrations' head {head}"
    return None
