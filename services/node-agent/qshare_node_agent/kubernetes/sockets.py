"""A gRPC server on a unix socket that comes back when its socket file is removed (the
kubelet empties its plugin directories when it restarts) and then calls `on_recreate`."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

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
        except FileNotFoundError:
            return True

    def _keep(self) -> None:
        while not self._stop.wait(self._check_s):
            if not self._gone():
                continue
            log.warning("socket %s was removed; serving it again", self.path)
            self._shutdown()
            self._serve()
            self.restarts += 1
            if self._on_recreate is not None:
                try:
                    self._on_recreate()
                except Exception:
                    log.exception(
                        "re-announcing %s failed; will retry on the next removal", self.path
                    )
