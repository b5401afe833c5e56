"""`auto` release in `qshare bench model`: the owner's release thread replayed in simulated
time. Gaps between high priority's activity are counted as the driver counts them (from HP's
last completion seen to its next launch, once per gap), folded every period into the driver's
own history and decided by the driver's own rule (qs_release_auto_*, through the binding)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qshare.bench.model_hosts import Loop

LpTotals = Callable[[], tuple[int, int]]  # LP's completed device ns and launches so far


@dataclass(frozen=True)
class AutoSettings:
    bound_ns: int  # HP's p99 may grow by at most this much
    max_delay_ns: int  # the fixed delay it never exceeds (and keeps until it has seen enough)
    held_ns: int  # what LP's launcher may hold in flight: its window, or a device-gate slice


class AutoRelease:
    """Chooses the gate's release delay every period, as the owner does."""

    def __init__(self, loop: Loop, settings: AutoSettings, lp_totals: LpTotals) -> None:
        from qshare_driver.release_auto import AutoHistory, buckets, period_ns

        self.loop, self.s, self._lp_totals = loop, settings, lp_totals
        self.delay_ns = settings.max_delay_ns
        self.delays_ns: list[int] = []  # the delay chosen at each period, for the figures
        self._history, self._period_ns = AutoHistory(), period_ns()
        self._count, self._sum = [0] * buckets(), [0] * buckets()
        self._last_seen = self._gap_seen = 0
        self._lp_before = (0, 0)

    @property
    def gaps_seen(self) -> int:
        """The gaps folded into the history so far (what the warm-up counts)."""
        return self._history.gaps_seen()

    def start(self) -> None:
        self.loop.at(self.loop.now + self._period_ns, self._tick)

    def hp_seen(self, t: int) -> None:
        """HP's completion at `t` as the interposer reports it (qs_launch_end)."""
        self._last_seen = max(self._last_seen, t)

    def hp_launched(self) -> None:
        """HP's launch: the gap since its last completion seen is counted, once."""
        last, now = self._last_seen, self.loop.now
        if not last or last == self._gap_seen or now <= last:
            return
        from qshare_driver.release_auto import bucket

        self._gap_seen = last
        b = bucket(now - last)
        self._count[b] += 1
        self._sum[b] += now - last

    def _tick(self) -> None:
        dev, launches = self._lp_totals()  # only grow here: no vGPU of the model goes away
        dev0, launches0 = self._lp_before
        self._history.fold(self._count, self._sum, dev - dev0, launches - launches0)
        self._lp_before = (dev, launches)
        self._count, self._sum = [0] * len(self._count), [0] * len(self._sum)
        penalty = self._history.penalty_ns(1, self.s.held_ns, self.s.bound_ns)
        self.delay_ns = self._history.choose_ns(self.s.bound_ns, self.s.max_delay_ns, penalty)
        self.delays_ns.append(self.delay_ns)
        self.loop.at(self.loop.now + self._period_ns, self._tick)
