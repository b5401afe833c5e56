"""The host side of `qshare bench model`: an event loop over the card model (card_model.py),
qshare's gate as the interposer keeps it (high priority's first launch closes it; it opens
once HP has been idle the release delay), a low-priority process replaying a training trace
under the window (and optionally the device gate), and a high-priority one serving Poisson
requests replayed from an inference trace."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from qshare.bench.card_model import Card, Item

Rows = list[tuple[int, int]]  # (host gap ns before the launch, device ns of the launch)


class Loop:
    """Host events in time order, interleaved with the card's own."""

    def __init__(self, card: Card) -> None:
        self.card = card
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0

    @property
    def now(self) -> int:
        return self.card.now

    def at(self, t: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn))

    def run(self, until: int) -> None:
        heap, card = self._heap, self.card
        while True:
            t = card.next_event()
            if heap and (t is None or heap[0][0] < t):
                t = heap[0][0]
            if t is None or t > until:
                card.advance(until)
                return
            card.advance(t)
            while heap and heap[0][0] <= card.now:
                heapq.heappop(heap)[2]()


class ChosenDelay(Protocol):
    """A release delay chosen as HP runs (model_auto.AutoRelease: the driver's `auto`)."""

    delay_ns: int

    def hp_launched(self) -> None: ...

    def hp_seen(self, t: int) -> None: ...


@dataclass
class Gate:
    """The card's gate word: closed by HP's launches, opened `delay_ns` (or the delay `auto`
    has chosen) after HP's work has all completed and been seen (`seen_ns` later: the
    interposer's fence). `enabled` False: no qshare, nothing closes it."""

    loop: Loop
    delay_ns: int
    enabled: bool = True
    seen_ns: int = 0
    auto: ChosenDelay | None = None
    is_open: bool = True
    closed_ns: int = 0
    _hp_inflight: int = 0
    _epoch: int = 0
    _closed_at: int = 0
    _waiters: list[Callable[[], None]] = field(default_factory=list)

    def hp_launched(self) -> None:
        if self.auto is not None:
            self.auto.hp_launched()
        self._hp_inflight += 1
        self._epoch += 1  # a release under way is called off
        if self.enabled and self.is_open:
            self.is_open, self._closed_at = False, self.loop.now

    def hp_completed(self) -> None:
        self._hp_inflight -= 1
        seen = self.loop.now + self.seen_ns
        if self.auto is not None:
            self.loop.at(seen, partial(self.auto.hp_seen, seen))
        if self._hp_inflight == 0 and not self.is_open:
            epoch = self._epoch
            delay = self.delay_ns if self.auto is None else self.auto.delay_ns
            self.loop.at(seen + delay, lambda: self._open(epoch))

    def when_open(self, fn: Callable[[], None]) -> None:
        if self.is_open:
            fn()
        else:
            self._waiters.append(fn)

    def _open(self, epoch: int) -> None:
        if epoch != self._epoch or self._hp_inflight:
            return
        self.is_open = True
        self.closed_ns += self.loop.now - self._closed_at
        waiters, self._waiters = self._waiters, []
        for fn in waiters:
            fn()
        self.loop.card.poke()


@dataclass(frozen=True)
class LpSettings:
    """How the low-priority process submits. `window_ns` None: plain CUDA, bounded only by
    `depth` launches queued (the driver's push buffer)."""

    window_ns: int | None = None
    depth: int = 1024
    launch_ns: int = 0  # what the interposer adds to each launch on the host
    wake_ns: int = 20_000  # a thread asleep on the gate or the window wakes this late
    gated: bool = False  # waits at launch while the gate is closed (qshare)
    device_gate_slice_ns: int = 0  # > 0: a wait on the gate word after each slice of work
    batch_fraction: int = 4  # a batch's fence is recorded at this fraction of the window


@dataclass
class Batch:
    ns: int = 0  # the device time of its launches
    left: int = 0  # its launches the card has not ended
    closed: bool = False  # its fence is recorded


class BatchFences:
    """How the interposer sees LP's completions: one fence behind each batch of launches,
    recorded when the batch's device time reaches `close_ns` or when the launcher stops, and
    seen by its completion thread `wake_ns` after the card ends the batch's last launch."""

    def __init__(self, loop: Loop, close_ns: int, wake_ns: int, seen: Callable[[int], None]):
        self.loop, self.close_ns, self.wake_ns, self._seen = loop, close_ns, wake_ns, seen
        self._open = Batch()

    def add(self, dur: int) -> Batch:
        batch = self._open
        batch.ns += dur
        batch.left += 1
        if batch.ns >= self.close_ns:
            self.close()
        return batch

    def close(self) -> None:
        batch = self._open
        if batch.left == 0 and batch.ns == 0:
            return
        batch.closed, self._open = True, Batch()
        if batch.left == 0:
            self._ended(batch)

    def launch_ended(self, batch: Batch) -> None:
        batch.left -= 1
        if batch.left == 0 and batch.closed:
            self._ended(batch)

    def _ended(self, batch: Batch) -> None:
        self.loop.at(self.loop.now + self.wake_ns, lambda: self._seen(batch.ns))


class LowPriority:
    """Replays a training timeline in a loop; counts the launches the card completed. Under a
    window, its queued device time is what the interposer sees: batches whose fence it has
    not yet seen complete (BatchFences)."""

    def __init__(self, loop: Loop, gate: Gate, rows: Rows, settings: LpSettings) -> None:
        if not rows:
            raise ValueError("a low-priority timeline needs at least one launch")
        self.loop, self.gate, self.rows, self.s = loop, gate, rows, settings
        self.completed = 0
        self.completed_ns = 0  # their device time
        self._next = 0
        self._inflight = 0
        self._queued_ns = 0
        self._sliced_ns = 0
        self._stalled = False
        close_ns = (settings.window_ns or 0) // settings.batch_fraction
        self._fences = BatchFences(loop, close_ns, settings.wake_ns, self._seen)
        from qshare_driver import lp_window_admits  # the interposer's own rule

        self._admits = lp_window_admits

    def start(self) -> None:
        self.loop.at(self.rows[0][0], self._launch)

    def _launch(self) -> None:
        if self.s.gated and not self.gate.is_open:
            self._fences.close()
            self.gate.when_open(self._woken)
            return
        if not self._admitted():
            self._fences.close()
            self._stalled = True
            return
        dur = self.rows[self._next % len(self.rows)][1]
        self._submit(dur)
        self._next += 1
        gap = self.rows[self._next % len(self.rows)][0]
        self.loop.at(self.loop.now + self.s.launch_ns + gap, self._launch)

    def _woken(self) -> None:
        self.loop.at(self.loop.now + self.s.wake_ns, self._launch)

    def _admitted(self) -> bool:
        if self.s.window_ns is None:
            return self._inflight < self.s.depth
        return self._admits(self._queued_ns, self.s.window_ns)

    def _submit(self, dur: int) -> None:
        self._inflight += 1
        self._queued_ns += dur
        batch = None if self.s.window_ns is None else self._fences.add(dur)
        self.loop.card.submit("lp", Item(dur, partial(self._done, dur, batch)))
        if self.s.device_gate_slice_ns:
            self._sliced_ns += dur
            if self._sliced_ns >= self.s.device_gate_slice_ns:
                self._sliced_ns = 0
                self.loop.card.submit("lp", Item(0, wait=lambda: self.gate.is_open))

    def _done(self, dur: int, batch: Batch | None, _t: int) -> None:
        self._inflight -= 1
        self.completed += 1
        self.completed_ns += dur
        if batch is None:  # no window: the driver's queue frees a slot at once
            self._seen(dur)
        else:
            self._fences.launch_ended(batch)

    def _seen(self, ns: int) -> None:
        self._queued_ns -= ns
        if self._stalled and self._admitted():
            self._stalled = False
            self._woken()


class HighPriority:
    """Poisson requests, one at a time, each a replay of an inference request's launches;
    a request's latency runs from its arrival to the completion of its last launch."""

    def __init__(
        self, loop: Loop, gate: Gate, request: Rows, rate_per_s: float, seed: int, until_ns: int
    ) -> None:
        if not request:
            raise ValueError("a high-priority request needs at least one launch")
        self.loop, self.gate, self.request = loop, gate, request
        self.latencies_ns: list[int] = []
        self._arrivals = _poisson(rate_per_s, seed, until_ns)
        self._waiting: list[int] = []
        self._busy = False

    def start(self) -> None:
        for t in self._arrivals:
            self.loop.at(t, partial(self._arrive, t))

    def _arrive(self, t: int) -> None:
        self._waiting.append(t)
        if not self._busy:
            self._begin()

    def _begin(self) -> None:
        self._busy = True
        arrival = self._waiting.pop(0)
        self._step(arrival, 0)

    def _step(self, arrival: int, i: int) -> None:
        last = i == len(self.request) - 1
        self.gate.hp_launched()
        dur = self.request[i][1]
        self.loop.card.submit("hp", Item(dur, lambda t: self._done(arrival, t, last)))
        if not last:
            gap = self.request[i + 1][0]
            self.loop.at(self.loop.now + gap, lambda: self._step(arrival, i + 1))

    def _done(self, arrival: int, t: int, last: bool) -> None:
        self.gate.hp_completed()
        if not last:
            return
        self.latencies_ns.append(t - arrival)
        self._busy = False
        if self._waiting:
            self._begin()


def _poisson(rate_per_s: float, seed: int, until_ns: int) -> list[int]:
    if rate_per_s <= 0:
        raise ValueError(f"the request rate must be > 0, got {rate_per_s}")
    rng, t, out = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rate_per_s) * 1e9) < until_ns:
        out.append(int(t))
    return out
