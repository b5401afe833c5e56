"""The kubelet's DRA resource-health service (`DRAResourceHealth.NodeWatchResources`, v1 and
v1alpha1) on the DRA socket: each watcher gets every card's health as a device of this
node's pool, then again at once when a card's health changes and every `resend_s` (the
kubelet counts a device it has not heard of for 30 s as Unknown). The kubelet shows it in
the status of the pods whose claims hold the device (`allocatedResourcesStatus`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from qshare_node_agent.kubernetes import wire
from qshare_node_agent.kubernetes.backend import CardInfo

PROTOS = (wire.DRA_HEALTH_V1, wire.DRA_HEALTH_V1ALPHA1)
SERVICE = "DRAResourceHealth"


def supported_services() -> list[str]:
    """The names the registration lists (`<package>.DRAResourceHealth`), newest first."""
    return [wire.api(proto).service_name(SERVICE) for proto in PROTOS]


class HealthStreams:
    """Thread-safe `changed()`; the streams run on the DRA socket's event loop."""

    def __init__(self, cards: Callable[[], list[CardInfo]], pool: str, resend_s: float) -> None:
        self._cards = cards
        self._pool = pool
        self._resend_s = resend_s
        self._lock = threading.Lock()
        self._waiting: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        impl = {"NodeWatchResources": self.watch}
        return [wire.service_handler(wire.api(proto), SERVICE, impl) for proto in PROTOS]

    def changed(self) -> None:
        """A card's health (or anything else of it) changed: every stream sends now."""
        with self._lock:
            waiting = list(self._waiting)
        for loop, event in waiting:
            with contextlib.suppress(RuntimeError):  # its loop closed: the stream is gone
                loop.call_soon_threadsafe(event.set)

    async def watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        api = _api_of(request)
        woken = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiting.add(woken)
        try:
            while True:
                woken[1].clear()
                yield self.response(api)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken[1].wait(), self._resend_s)
        finally:
            with self._lock:
                self._waiting.discard(woken)

    def response(self, api: wire.Api) -> Any:
        """Every card's health now, as a `NodeWatchResourcesResponse` of `api`."""
        now = int(time.time())
        response = api.message("NodeWatchResourcesResponse")
        for card in self._cards():
            response.devices.add(
                device=api.message("DeviceIdentifier", pool_name=self._pool,
                                   device_name=f"gpu-{card.index}"),
                health="HEALTHY" if card.healthy else "UNHEALTHY",
                last_updated_time=now,
                message="" if card.healthy else _unhealthy_message(card),
            )  # fmt: skip
        return response


def _unhealthy_message(card: CardInfo) -> str:
    return f"card {card.index} ({card.uuid}) is reported unhealthy by the qshare node agent"


def _api_of(request: Any) -> wire.Api:
    package = request.DESCRIPTOR.file.package
    return next(wire.api(p) for p in PROTOS if wire.api(p).package == package)
