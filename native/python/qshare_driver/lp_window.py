"""Low priority's window rule as the node driver defines it (qs_lp_window_admits,
qs_lp_window_in_force), for Python launchers and models: one rule, in C, for all of them."""

from __future__ import annotations

from qshare_driver._lib import lib, u64


def lp_window_admits(queued_ns: int, window_ns: int) -> bool:
    """Whether a low-priority launch may go with `queued_ns` of its process's work in flight
    (estimated device time; 0 when none, and then it always may) under `window_ns`."""
    return bool(lib.qs_lp_window_admits(u64("queued_ns", queued_ns), u64("window_ns", window_ns)))


def lp_window_in_force_ns(window_ns: int, device_gate: bool) -> int:
    """The window a launcher applies given the card's (as `Client.lp_window_s` reads it): with
    the device gate on, at least the one kept while no high-priority process is attached."""
    return int(lib.qs_lp_window_in_force(u64("window_ns", window_ns), int(device_gate)))
