"""Carries the driver's event ring to NATS: a thread waits on the ring (the C call releases
the GIL) and hands each event to the agent's loop, which publishes it on
`qshare.evt.gpu.<node>.<gpu>.<kind>`. The ring's unit is an episode (busy, idle, attach,
death, OOM), never a launch, so the message rate is bounded by what happens on the card."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

from nats.aio.client import Client

from qshare.contracts import envelope, subjects
from qshare.contracts.agent import GpuEvent
from qshare_driver import Event, EventKind, Node
from qshare_driver.client import now_ns
from qshare_node_agent import metrics

log = logging.getLogger(__name__)
POLL_S = 1.0
"""How long one wait on the ring lasts before the thread checks whether to stop (the upper
bound of a stop; shorter waits cost wake-ups that contend for the interpreter's lock)."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
"""After a failed read the thread waits this long (doubling up to the maximum) and reads
again: a driver error is logged and counted, never the end of the node's events."""


class EventPump:
    """Reads `node`'s ring on a thread and publishes every event through `nc`."""

    def __init__(self, node: Node, nc: Client, node_name: str, uuids: dict[int, str]) -> None:
        self._node = node
        self._nc = nc
        self._name = node_name
        self._uuids = uuids
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.listeners: list[Callable[[Event], None]] = []

    def announce_cards(self, cards: Iterable[int]) -> None:
        """Queue each card's present state as a busy or idle event (seq 0, value 0), ahead of
        the ring's next events. An adopted segment's events from before the agent opened it
        are skipped, so a card that went idle while no agent ran would otherwise never say so
        (and the gangs suspended for it would stay suspended); a preemptor that was away
        from NATS missed events too (see `Announcer`). Call from the agent's loop: the state
        is read there, so each announcement keeps its place among the ring's events."""
        for card in cards:
            kind = EventKind.BUSY if self._node.card_stats(card).busy else EventKind.IDLE
            found = Event(seq=0, time_ns=now_ns(), kind=kind, card=card, vgpu=None, pid=0, value=0)
            self._queue.put_nowait(found)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task publishing the events (None before `start`)."""
        return self._task

    @property
    def reading(self) -> bool:
        """Whether the thread reading the driver's ring runs (False before `start`)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read, args=(loop,), daemon=True)
        self._thread.start()
        self._task = asyncio.create_task(self._publish_all(), name="event pump")

    async def stop(self) -> None:
        await asyncio.to_thread(self.halt, None)
        if self._task is not None:
            self._task.cancel()

    def halt(self, within_s: float | None) -> bool:
        """Tell the reading thread to stop and wait up to `within_s` (None: until it ends;
        blocking) for it; True once it no longer reads (it ends at its next return from the
        driver)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(within_s)
        return not self.reading

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                event = self._node.next_event(POLL_S)
            except Exception:
                backoff = min(max(backoff * 2, BACKOFF_FIRST_S), BACKOFF_MAX_S)
                self._failed("read", "reading the driver's event ring failed; again in %.2f s",
                             backoff)  # fmt: skip
                self._stop.wait(backoff)
                continue
            backoff = 0.0
            if event is not None and not self._hand_over(loop, event):
                return

    def _hand_over(self, loop: asyncio.AbstractEventLoop, event: Event) -> bool:
        """Queue `event` on the agent's loop; False once that loop is closed."""
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:
            log.warning("node %s: event loop closed; the event reader stops", self._name)
            return False
        return True

    def _failed(self, stage: str, message: str, *args: object) -> None:
        metrics.PUMP_FAILURES.labels(self._name, stage).inc()
        log.exception(message, *args)

    async def _publish_all(self) -> None:
        while True:
            event = await self._queue.get()
            self._notify(event)
            try:
                await self._publish(event)
            except Exception:
                self._failed("publish", "publishing driver event %d failed", event.seq)

    def _notify(self, event: Event) -> None:
        """Hand `event` to every listener; one that raises is logged and skipped."""
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                self._failed("listener", "listener %r failed on event %d", listener, event.seq)

    async def _publish(self, event: Event) -> None:
        card = event.card if event.card is not None else -1
        gpu = self._uuids.get(card, "node")
        kind = event.kind.name.lower()
        dropped = self._node.dropped_events
        metrics.EVENTS.labels(self._name, kind).inc()
        body = GpuEvent(
            node=self._name, gpu=gpu, card=card, kind=kind, vgpu=event.vgpu, pid=event.pid,
            value=event.value, seq=event.seq, time_ns=event.time_ns, dropped=dropped,
        )  # fmt: skip
        wrapped = envelope.wrap(f"qshare-node-agent/{self._name}", f"io.qshare.gpu.{kind}", body)
        subject = subjects.gpu_event(self._name, gpu, kind)
        await self._nc.publish(
            subject, envelope.encode(wrapped), headers={"Nats-Msg-Id": wrapped.id}
        )
        self.published += 1
