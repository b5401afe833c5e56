"""What the preemptor read from the inventory about who owns a card, trusted for a short
while: a card removed from one node and registered on another is the other's this soon."""

from __future__ import annotations

import time
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Trusted(Generic[K, V]):
    """Values by key, each trusted for `for_s` seconds after it was read."""

    def __init__(self, for_s: float) -> None:
        self.for_s = for_s
        self._read: dict[K, tuple[V, float]] = {}

    def get(self, key: K) -> V | None:
        """The value read within `for_s`; None when none was, or it is older."""
        found = self._read.get(key)
        if found is None or time.monotonic() - found[1] > self.for_s:
            return None
        return found[0]

    def keep(self, key: K, value: V | None) -> None:
        """What was just read (None: nothing, and nothing is kept)."""
        if value is None:
            self._read.pop(key, None)
        else:
            self._read[key] = (value, time.monotonic())
