"""The auto release rule as pure functions (qs_release_auto_*): the owner's release thread and
the card model decide with it. Gaps of HP's requests in, a release delay out."""

from __future__ import annotations

import pytest

from qshare_driver._lib import ffi, lib
from qshare_driver.release_auto import AutoHistory, bucket, buckets, period_ns

MS = 1_000_000
US = 1_000


def history(gaps_ns: list[int], lp_kernel_ns: int = 50 * US, lp_launches: int = 1000
            ) -> AutoHistory:  # fmt: skip
    """One period that saw these gaps and LP's launches of one length."""
    count, total = [0] * buckets(), [0] * buckets()
    for gap in gaps_ns:
        count[bucket(gap)] += 1
        total[bucket(gap)] += gap
    h = AutoHistory()
    h.fold(count, total, lp_kernel_ns * lp_launches, lp_launches)
    return h


def test_a_gap_goes_to_the_log2_bucket_of_its_length() -> None:
    assert (bucket(1), bucket(1023), bucket(1024), bucket(30 * MS)) == (0, 9, 10, 24)


def test_gaps_longer_than_the_last_bucket_go_into_it() -> None:
    assert bucket(1 << 50) == buckets() - 1 == 39


def test_the_owner_revises_the_delay_every_20_ms() -> None:
    assert period_ns() == 20 * MS


def test_the_maximum_delay_holds_until_50_gaps_are_seen() -> None:
    assert history([30 * MS] * 49).choose_ns(2 * MS, 100 * MS, 500 * US) == 100 * MS


def test_a_steady_rate_whose_decayed_count_stays_under_50_still_leaves_the_maximum() -> None:
    # 20 requests/s: two gaps every five 20 ms periods; the decayed count settles near 40
    h = AutoHistory()
    for i in range(500):
        count, total = [0] * buckets(), [0] * buckets()
        if i % 5 in (0, 2):
            count[bucket(50 * MS)], total[bucket(50 * MS)] = 1, 50 * MS
        h.fold(count, total, 50 * US * 100, 100)
    assert h.gaps() < 50 and h.gaps_seen() == 200
    assert h.choose_ns(2 * MS, 100 * MS, 500 * US) < MS


def test_long_gaps_between_requests_get_a_short_delay() -> None:
    delay = history([30 * MS] * 100).choose_ns(2 * MS, 100 * MS, 500 * US)
    assert delay < MS


def test_no_gap_is_exposed_when_one_exposure_costs_more_than_the_bound() -> None:
    assert history([30 * MS] * 100).choose_ns(400 * US, 100 * MS, 500 * US) == 100 * MS


def test_gaps_inside_requests_are_not_exposed_beyond_the_bound() -> None:
    # each request leaves twenty 1 ms gaps inside it, each worth exposing on its own (LP gains
    # more than 4 x the 100 µs slice HP waits), but together 2.1 ms of waiting a request
    # against a 1 ms bound: the delay has to cover them
    gaps = ([30 * MS] + [1 * MS] * 20) * 20
    assert history(gaps).choose_ns(1 * MS, 100 * MS, 100 * US) > 1.5 * MS


def test_the_penalty_is_what_lp_may_hold_when_its_kernels_are_shorter() -> None:
    assert history([], lp_kernel_ns=50 * US).penalty_ns(1, 500 * US, 2 * MS) == 500 * US


def test_the_penalty_is_lps_mean_kernel_when_that_is_longer() -> None:
    assert history([], lp_kernel_ns=3 * MS).penalty_ns(1, 500 * US, 2 * MS) == 3 * MS


def test_without_lp_launches_an_attached_lp_is_taken_to_cost_the_bound() -> None:
    h = AutoHistory()
    assert (h.penalty_ns(1, 500 * US, 2 * MS), h.penalty_ns(0, 500 * US, 2 * MS)) == (2 * MS, 0)


def test_the_history_forgets_one_percent_a_period() -> None:
    h = history([30 * MS] * 100)
    h.fold([0] * buckets(), [0] * buckets(), 0, 0)
    assert h.gaps() == pytest.approx(99.0)


def test_a_history_of_the_wrong_width_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="gap_count and gap_sum_ns need 40 buckets"):
        AutoHistory().fold([0] * 3, [0] * 40, 0, 0)


def test_a_negative_count_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="lp_launches must be 0 to"):
        AutoHistory().fold([0] * 40, [0] * 40, 0, -1)


def test_the_c_rule_refuses_a_null_history() -> None:
    period = ffi.new("qs_release_auto_period *")
    assert lib.qs_release_auto_fold(ffi.NULL, period) == lib.QS_EINVAL
    assert lib.qs_release_auto_choose(ffi.NULL, 0, 5 * MS, 0) == 5 * MS


def test_a_penalty_past_the_largest_count_of_ns_saturates_instead_of_wrapping() -> None:
    """LP's counters are in the state part, which any tenant can rewrite: a mean kernel of
    2^62 ns held 8 times over, or 2^40 launchers holding 2^30 ns each, is more than 2^64 ns
    (before, the first came out 0, undefined behaviour, and the second wrapped to 0, so a
    short delay exposed HP)."""
    huge_kernel = history([], lp_kernel_ns=1 << 62, lp_launches=3)
    many_launchers = history([], lp_kernel_ns=1, lp_launches=1)
    most = (1 << 64) - 1
    assert huge_kernel.penalty_ns(8, 1, 2 * MS) == most
    assert many_launchers.penalty_ns(1 << 40, 1 << 30, 2 * MS) == most
