"""Sliding windows of device-time usage, one per card, built from the node agents' usage
reports. Over a window of W seconds of reports:

- a card's `harvestable` share is 1 - (device time high priority used there) / W: the part
  of the card low priority could have had;
- a vGPU's `share` is its own device time / W; it is known only for a vGPU present in every
  report of the window (it held the card the whole window).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from qshare.contracts.usage import CardUsage

FULL = 0.95
"""A window counts as whole once its reports cover this much of `window_s` (intervals jitter)."""


@dataclass(frozen=True)
class Sample:
    at: float
    interval_ns: int
    hp_ns: int
    used: dict[int, int]


@dataclass
class CardWindow:
    samples: deque[Sample] = field(default_factory=deque)

    def add(self, at: float, interval_ns: int, usage: CardUsage, window_s: float) -> None:
        used = {v.local_id: v.device_ns for v in usage.vgpus}
        self.samples.append(Sample(at, interval_ns, usage.hp_ns, used))
        limit = window_s * 1e9
        while self.covered_ns - self.samples[0].interval_ns >= limit:
            self.samples.popleft()

    @property
    def covered_ns(self) -> int:
        return sum(s.interval_ns for s in self.samples)

    def whole(self, window_s: float, now: float) -> bool:
        """Reports cover the window, and the last one is recent (the node still reports)."""
        fresh = bool(self.samples) and now - self.samples[-1].at <= window_s
        return fresh and self.covered_ns >= FULL * window_s * 1e9

    @property
    def harvestable(self) -> float:
        covered = self.covered_ns
        hp = sum(s.hp_ns for s in self.samples)
        return max(0.0, 1.0 - hp / covered) if covered else 0.0

    def share(self, local_id: int) -> float | None:
        """The vGPU's device time per window; None if some report of the window lacks it."""
        if not self.samples or any(local_id not in s.used for s in self.samples):
            return None
        return sum(s.used[local_id] for s in self.samples) / self.covered_ns
