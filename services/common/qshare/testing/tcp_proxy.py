"""A TCP proxy for tests: a service connects to a server (NATS, say) through it, and `cut()`
drops every connection through it at once and refuses new ones until `restore()`, as a
network partition between that one service and the server would."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

CHUNK = 65536


class TcpProxy:
    """Listens on a free port of 127.0.0.1; `url` is the upstream URL with that port."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"expected scheme://host:port, got {upstream_url!r}")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Future[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        self.url = ""
        self.connections = 0
        """Connections accepted and carried so far (refused ones are not counted)."""

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{self._scheme}://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def cut(self) -> None:
        """Drop every connection now (both ends at once: nothing more gets through) and
        refuse new ones until `restore()`."""
        self._cut = True
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    def restore(self) -> None:
        """Carry new connections again."""
        self._cut = False

    async def _carry(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._cut:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(self._host, self._port)
        except OSError:
            client_w.transport.abort()
            return
        self.connections += 1
        self._writers.update((client_w, server_w))
        pipes = [self._pipe(client_r, server_w), self._pipe(server_r, client_w)]
        link = asyncio.ensure_future(asyncio.gather(*pipes))
        self._links.add(link)
        try:
            await asyncio.wait({link})  # ends when an end closes or cut() cancels it
        finally:
            self._links.discard(link)
            self._writers.difference_update((client_w, server_w))
            for writer in (client_w, server_w):
                writer.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until either end closes; then close the other (no half-open connection)."""
        with contextlib.suppress(OSError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
