"""`qshare bench colocation --only NAMES`: which of the co-location benchmark's scenarios to
run. NAMES are shapes (steady, bursty, eager) and modes (hp-alone, qshare-1ms, …); a scenario
runs when its shape and its mode are both named, or its kind of name is not named at all."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class SelectionError(ValueError):
    """An `--only` the benchmark cannot read; the message names what is wrong."""


@dataclass(frozen=True)
class Selection:
    shapes: frozenset[str] = frozenset()
    modes: frozenset[str] = frozenset()
    everything: bool = True
    """No `--only`: the whole benchmark, variants and policies included."""

    @classmethod
    def parse(cls, only: str | None, shapes: Iterable[str], modes: Iterable[str]) -> Selection:
        if only is None:
            return cls()
        known_shapes, known_modes = set(shapes), set(modes)
        names = {n.strip() for n in only.split(",") if n.strip()}
        unknown = sorted(names - known_shapes - known_modes)
        if not names or unknown:
            what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "no names"
            raise SelectionError(
                f"--only: {what}; name shapes ({', '.join(sorted(known_shapes))}) and/or "
                f"modes ({', '.join(sorted(known_modes))})"
            )
        return cls(
            frozenset(names & known_shapes), frozenset(names & known_modes), everything=False
        )

    def shape(self, name: str) -> bool:
        return not self.shapes or name in self.shapes

    def mode(self, name: str) -> bool:
        return not self.modes or name in self.modes
