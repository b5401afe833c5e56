"""How the starvation watch measures a card over its window: the harvestable share is what
high priority left, a vGPU's share is its own device time, both per window length, and only
over reports that cover the window."""

from __future__ import annotations

from qshare.contracts.usage import CardUsage, VgpuUsage
from qshare_preemptor.windows import CardWindow

S = 10**9


def report(hp_ns: int, **vgpus: int) -> CardUsage:
    used = [VgpuUsage(local_id=int(k[1:]), device_ns=v) for k, v in vgpus.items()]
    return CardUsage(gpu="g0", hp_ns=hp_ns, vgpus=used)


def filled(*reports: CardUsage, window_s: float = 2.0) -> CardWindow:
    window = CardWindow()
    for i, usage in enumerate(reports):
        window.add(float(i), S, usage, window_s)
    return window


def test_the_harvestable_share_is_what_high_priority_left_of_the_window() -> None:
    window = filled(report(S), report(S // 2))
    assert window.harvestable == 0.25


def test_a_vgpus_share_is_its_device_time_per_window() -> None:
    window = filled(report(0, v1=S // 2), report(0, v1=S // 2))
    assert window.share(1) == 0.5


def test_a_vgpu_missing_from_a_report_of_the_window_has_no_share_yet() -> None:
    window = filled(report(0), report(0, v1=S))
    assert window.share(1) is None


def test_reports_older_than_the_window_are_dropped() -> None:
    window = filled(report(S), report(0), report(0))
    assert (len(window.samples), window.harvestable) == (2, 1.0)


def test_a_window_counts_only_once_its_reports_cover_it() -> None:
    assert not filled(report(0), window_s=2.0).whole(2.0, now=0.0)
    assert filled(report(0), report(0), window_s=2.0).whole(2.0, now=1.0)


def test_a_window_whose_node_stopped_reporting_does_not_count() -> None:
    assert not filled(report(0), report(0), window_s=2.0).whole(2.0, now=10.0)


def test_high_priority_time_beyond_the_window_leaves_nothing_not_less() -> None:
    assert filled(report(2 * S), report(2 * S)).harvestable == 0.0
