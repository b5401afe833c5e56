"""A gRPC server on a unix socket that comes back when its socket file is removed (the
kubelet empties its plugin directories when it restarts) and then calls `on_recreate`;
threaded (`SocketServer`) or on an event loop of its own (`LoopSocketServer`)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)
STOP_GRACE_S = 0.1  # calls in flight may finish; the kubelet retries what did not


class SocketServer:
    def __init__(
        self,
        path: Path,
        handlers: Sequence[grpc.GenericRpcHandler],
        workers: int,
        check_s: float,
        on_recreate: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self._handlers = handlers
        self._workers = workers
        self._check_s = check_s
        self._on_recreate = on_recreate
        self._server: grpc.Server | None = None
        self._inode: int | None = None
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self.restarts = 0

    def start(self) -> None:
        self._serve()
        self._stop.clear()
        self._keeper = threading.Thread(
            target=self._keep, name=f"keep {self.path.name}", daemon=True
        )
        self._keeper.start()

    def stop(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
        self._shutdown()
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers))
        server.add_generic_rpc_handlers(tuple(self._handlers))
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self._inode = os.stat(self.path).st_ino

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.stop(grace=STOP_GRACE_S).wait()
            self._server = None

    def _gone(self) -> bool:
        try:
            return os.stat(self.path).st_ino != self._inode
        except OSError:  # removed, or a directory on its path replaced (NotADirectoryError)
            return True

    def _keep(self) -> None:
        failing = False  # the last attempt to serve again failed: retried every check
        while not self._stop.wait(self._check_s):
            if not self._gone():
                continue
            if not failing:
                log.warning("socket %s was removed; serving it again", self.path)
            self._shutdown()
            try:
                self._serve()
            except Exception as exc:  # the kubelet's directories in flux: try again
                if not failing:
                    log.warning("serving %s again failed (%s); retrying", self.path, exc)
                failing = True
                continue
            failing = False
            self.restarts += 1
            if self._on_recreate is not None:
                try:
                    self._on_recreate()
                except Exception:
                    log.exception(
                        "re-announcing %s failed; will retry on the next removal", self.path
                    )


class LoopSocketServer(SocketServer):
    """The same served by `grpc.aio` on an event loop in a thread of its own: handlers are
    coroutines and run one at a time on that loop, with no pool of threads contending for
    the interpreter lock (under a hundred concurrent calls, the pool's switching costs as
    much as the calls' own work). A handler must not block the loop for long."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    def _serve(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        started: futures.Future[None] = futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(self._loop, started), name=f"serve {self.path.name}",
            daemon=True,
        )  # fmt: skip
        self._thread.start()
        try:
            started.result()  # raises what stopped the server from starting
        except Exception:
            self._thread.join()  # its loop has ended and closed
            self._thread = None
            raise
        self._inode = os.stat(self.path).st_ino

    def _run(self, loop: asyncio.AbstractEventLoop, started: futures.Future[None]) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main(started))
        finally:
            loop.close()

    async def _main(self, started: futures.Future[None]) -> None:
        try:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers(tuple(self._handlers))
            server.add_insecure_port(f"unix://{self.path}")
            await server.start()
        except Exception as exc:
            started.set_exception(exc)
            return
        self._stopping = asyncio.Event()
        started.set_result(None)
        await self._stopping.wait()
        await server.stop(STOP_GRACE_S)  # stopped from its own loop: grpc.aio needs that

    def _shutdown(self) -> None:
        if self._thread is None or self._loop is None or self._stopping is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        self._thread = None
