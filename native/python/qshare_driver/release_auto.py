"""The auto release rule as the node driver applies it (qs_release_auto_*), for models that
replay it in simulated time: the same decayed history, penalty and choice as the owner's
release thread, one rule in C for both."""

from __future__ import annotations

from collections.abc import Sequence

from qshare_driver._lib import ffi, lib, u64


def buckets() -> int:
    """How many log2 buckets of gaps the rule keeps (bucket b holds [2^b, 2^(b+1)) ns)."""
    return int(lib.QS_RELEASE_AUTO_BUCKETS)


def period_ns() -> int:
    """How often the owner folds a period into the history and revises the delay."""
    return int(lib.QS_RELEASE_AUTO_PERIOD_NS)


def bucket(gap_ns: int) -> int:
    """The bucket of a gap between high priority's activity."""
    return int(lib.qs_release_auto_bucket(u64("gap_ns", gap_ns)))


class AutoHistory:
    """The owner's decayed history of HP's gaps and LP's kernels, period by period."""

    def __init__(self) -> None:
        self._history = ffi.new("qs_release_auto_history *")

    def fold(
        self, gap_count: Sequence[int], gap_sum_ns: Sequence[int], lp_device_ns: int,
        lp_launches: int,
    ) -> None:  # fmt: skip
        """Decay what was there by one period and add what this period saw, by bucket."""
        n = buckets()
        if len(gap_count) != n or len(gap_sum_ns) != n:
            raise ValueError(f"gap_count and gap_sum_ns need {n} buckets each, "
                             f"got {len(gap_count)} and {len(gap_sum_ns)}")  # fmt: skip
        period = ffi.new("qs_release_auto_period *")
        for b in range(n):
            period.gap_count[b] = u64("gap_count", gap_count[b])
            period.gap_sum_ns[b] = u64("gap_sum_ns", gap_sum_ns[b])
        period.lp_device_ns = u64("lp_device_ns", lp_device_ns)
        period.lp_launches = u64("lp_launches", lp_launches)
        lib.qs_release_auto_fold(self._history, period)

    def gaps(self) -> float:
        """The decayed number of gaps the history holds."""
        return float(sum(self._history.gap_count))

    def gaps_seen(self) -> int:
        """Every gap folded in, never decayed (what the warm-up counts)."""
        return int(self._history.gaps_seen)

    def penalty_ns(self, inflight: int, held_ns: int, bound_ns: int) -> int:
        """How long HP's launch on a released card waits behind LP's work in flight."""
        return int(lib.qs_release_auto_penalty(
            self._history, u64("inflight", inflight), u64("held_ns", held_ns),
            u64("bound_ns", bound_ns)))  # fmt: skip

    def choose_ns(self, bound_ns: int, max_delay_ns: int, penalty_ns: int) -> int:
        """The release delay the owner would set now."""
        return int(lib.qs_release_auto_choose(
            self._history, u64("bound_ns", bound_ns), u64("max_delay_ns", max_delay_ns),
            u64("penalty_ns", penalty_ns)))  # fmt: skip
