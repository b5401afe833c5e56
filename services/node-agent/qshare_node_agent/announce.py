"""Announcing the cards' present busy/idle state again, on request (`qshare.nodes.announce`,
a reconnection to NATS, a new registration), at most once per interval: a burst of requests
makes one announcement now and at most one more at the interval's end, never a burst of
events. The last request is never dropped: one arriving inside the interval is answered when
it ends, so a preemptor that subscribed just after an announcement still gets the state."""

from __future__ import annotations

import asyncio
import math
import time

from qshare.service import cancelled
from qshare_node_agent.events import EventPump


class Announcer:
    def __init__(self, pump: EventPump, cards: list[int], min_interval_s: float) -> None:
        self._pump = pump
        self._cards = cards
        self._min_interval_s = min_interval_s
        self._last = -math.inf
        self._later: asyncio.Task[None] | None = None
        self.requests = 0
        self.announcements = 0

    def request(self) -> None:
        """Announce now, or once the interval since the last announcement has passed."""
        self.requests += 1
        if self._later is not None and not self._later.done():
            return  # the announcement already due answers this request too
        wait = self.due_in()
        if wait <= 0:
            self._announce()
        else:
            self._later = asyncio.create_task(self._announce_in(wait))

    def due_in(self) -> float:
        """Seconds until a request would be answered at once (0: now)."""
        return max(0.0, self._last + self._min_interval_s - time.monotonic())

    def announced(self) -> None:
        """Count an announcement made without a request (the agent's own, at start)."""
        self._last = time.monotonic()

    async def stop(self) -> None:
        if self._later is not None:
            await cancelled(self._later)

    async def _announce_in(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        self._announce()

    def _announce(self) -> None:
        self._pump.announce_cards(self._cards)
        self.announced()
        self.announcements += 1
