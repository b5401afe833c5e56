"""A discrete-event model of one GPU shared by processes, for `qshare bench model`: each
context's work runs in order; the card runs one context at a time and, while another has
work, switches at the end of a timeslice (preempting a running kernel) or when the running
context runs dry, as a GPU time-slices contexts without MPS. No host, no noise: the card."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Done = Callable[[int], None]  # told the time its item completed


@dataclass(frozen=True)
class CardTiming:
    """How the card hands itself between contexts (fitted to the H100, see `bench model`)."""

    timeslice_ns: int = 2_000_000
    switch_ns: int = 25_000  # the card runs nothing while it saves one context, loads another

    def __post_init__(self) -> None:
        if self.timeslice_ns <= 0:
            raise ValueError(f"timeslice_ns must be > 0, got {self.timeslice_ns}")
        if self.switch_ns < 0:
            raise ValueError(f"switch_ns must be >= 0, got {self.switch_ns}")


@dataclass
class Item:
    """A kernel (`remaining_ns` of device time) or, with `wait` set, a wait on a word in
    memory (cuStreamWaitValue32): it ends as soon as `wait()` reads true, and until then its
    context has nothing the card can run."""

    remaining_ns: int
    done: Done | None = None
    wait: Callable[[], bool] | None = None


@dataclass
class Context:
    name: str
    queue: deque[Item] = field(default_factory=deque)
    queued_ns: int = 0  # the device time of the kernels queued, the running one's remainder
    busy_ns: int = 0

    def runnable(self) -> bool:
        if not self.queue:
            return False
        head = self.queue[0]
        return head.wait is None or head.wait()


class Card:
    """The card's clock is `now`; `advance(t)` runs it to t, ending items on the way."""

    def __init__(self, timing: CardTiming) -> None:
        self.timing = timing
        self.now = 0
        self.contexts: dict[str, Context] = {}
        self.current: Context | None = None
        self._last: Context | None = None
        self._ready_at = 0  # a switch in progress ends here
        self._slice_start = 0
        self.switches = 0

    def context(self, name: str) -> Context:
        if name not in self.contexts:
            self.contexts[name] = Context(name)
        return self.contexts[name]

    def submit(self, name: str, item: Item) -> None:
        """Queue an item in a context at `now` (the card must have been advanced to now)."""
        if item.remaining_ns < 0:
            raise ValueError(f"an item's device time must be >= 0, got {item.remaining_ns}")
        ctx = self.context(name)
        ctx.queue.append(item)
        ctx.queued_ns += item.remaining_ns
        if self.current is None:
            self._pick()

    def poke(self) -> None:
        """A word a wait reads has changed: an idle card looks for work again."""
        if self.current is None or not self.current.runnable():
            self._pick()

    def next_event(self) -> int | None:
        """When the card next ends an item, ends a switch or ends a timeslice (None: idle)."""
        ctx = self.current
        if ctx is None:
            return None
        if self.now < self._ready_at:
            return self._ready_at
        t = self.now + ctx.queue[0].remaining_ns
        if self._others_runnable(ctx):
            end = self._slice_end()
            return end if end < t else t
        return t

    def advance(self, until: int) -> None:
        while (t := self.next_event()) is not None and t <= until:
            self._run_to(t)
            self._settle()
        self._run_to(until)

    def _slice_end(self) -> int:
        """A context's slice restarts while nobody else waits, so the slice another context
        meets is the one under way: it ends this much later, uniformly in (0, timeslice]."""
        elapsed, ts = max(self.now - self._slice_start, 0), self.timing.timeslice_ns
        return self._slice_start + (elapsed // ts + 1) * ts

    def _others_runnable(self, ctx: Context) -> bool:
        for c in self.contexts.values():
            if c is not ctx and c.queue and (c.queue[0].wait is None or c.queue[0].wait()):
                return True
        return False

    def _run_to(self, t: int) -> None:
        ctx = self.current
        start = max(self.now, self._ready_at)
        if ctx is not None and t > start:
            ran = min(t - start, ctx.queue[0].remaining_ns)
            ctx.queue[0].remaining_ns -= ran
            ctx.queued_ns -= ran
            ctx.busy_ns += ran
        self.now = max(self.now, t)

    def _settle(self) -> None:
        ctx = self.current
        assert ctx is not None
        if self.now < self._ready_at:
            return
        if ctx.queue and ctx.queue[0].wait is None and ctx.queue[0].remaining_ns == 0:
            self._end_head(ctx)
        while ctx.queue and ctx.queue[0].wait is not None and ctx.queue[0].wait():
            self._end_head(ctx)
        if not ctx.runnable():
            self._pick()
        elif self._slice_ends_now() and self._others_runnable(ctx):
            self._pick(after=ctx)

    def _slice_ends_now(self) -> bool:
        elapsed = self.now - self._slice_start
        return elapsed > 0 and elapsed % self.timing.timeslice_ns == 0

    def _end_head(self, ctx: Context) -> None:
        item = ctx.queue.popleft()
        if item.done is not None:
            item.done(self.now)

    def _pick(self, after: Context | None = None) -> None:
        """Run the next runnable context, round robin from `after` (or the current one)."""
        order = list(self.contexts.values())
        pivot = after or self.current or self._last
        start = order.index(pivot) + 1 if pivot in order else 0
        for ctx in order[start:] + order[:start]:
            if ctx.runnable():
                self._switch(ctx)
                return
        self.current = None

    def _switch(self, ctx: Context) -> None:
        if ctx is not self._last:
            self._ready_at = self.now + self.timing.switch_ns
            self.switches += 1
        else:
            self._ready_at = self.now
        if ctx is not self.current:
            self._slice_start = self._ready_at
        self.current = self._last = ctx
