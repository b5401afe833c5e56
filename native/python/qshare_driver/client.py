"""A workload process's attachment to one vGPU: launches, memory and the simulated device."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from qshare_driver._lib import check, ffi, lib, text
from qshare_driver.guarded import Guarded
from qshare_driver.lp_window import lp_window_in_force_ns
from qshare_driver.node import Priority


@dataclass(frozen=True)
class ClientInfo:
    vgpu: int
    card: int
    card_uuid: str
    priority: Priority
    core_share: int
    mem_limit: int
    mem_used: int
    mem_reserved: int
    card_total_mem: int


class Client:
    """One process attached to one vGPU. Detaching returns its memory reservations."""

    def __init__(self, handle: Any, vgpu_id: int) -> None:
        self._guard = Guarded(handle, f"client of vGPU {vgpu_id} is detached")
        self.vgpu_id = vgpu_id

    @classmethod
    def attach(cls, segment: str, vgpu_id: int, directory: str | Path | None = None) -> Client:
        out = ffi.new("qs_client **")
        d = ffi.NULL if directory is None else str(directory).encode()
        check(lib.qs_client_attach(segment.encode(), d, vgpu_id, out))
        return cls(out[0], vgpu_id)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(handle, *args)`, counted as in progress so that a detach from another thread
        waits for it instead of freeing the handle under it; refused once detached."""
        return self._guard.call(fn, *args)

    def detach(self) -> None:
        """Detach once calls in progress on other threads have returned (a launch held at the
        gate is waited for); later calls are refused."""
        handle = self._guard.retire()
        if handle is not None:
            check(lib.qs_client_detach(handle))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()

    def launch_begin(self) -> None:
        check(self._call(lib.qs_launch_begin))

    def launch_end(self) -> None:
        check(self._call(lib.qs_launch_end))

    @contextmanager
    def launch(self) -> Iterator[None]:
        """Bracket one unit of device work."""
        self.launch_begin()
        try:
            yield
        finally:
            self.launch_end()

    def reserve(self, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError(f"cannot reserve a negative number of bytes ({nbytes})")
        check(self._call(lib.qs_mem_reserve, nbytes))

    def release(self, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError(f"cannot release a negative number of bytes ({nbytes})")
        check(self._call(lib.qs_mem_release, nbytes))

    def run_kernel(self, seconds: float) -> None:
        """One kernel of `seconds` on the simulated device (gate, FIFO card, accounting)."""
        check(self._call(lib.qs_sim_kernel, round(seconds * 1e9)))

    def run_kernels(self, count: int, seconds: float) -> None:
        """`count` kernels of `seconds` back to back, each gated as its own launch, in C."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        check(self._call(lib.qs_sim_kernels, count, round(seconds * 1e9)))

    def replay(
        self,
        timeline: Sequence[tuple[int, int]],
        window_s: float | None = None,
        slice_s: float | None = None,
    ) -> tuple[int, int]:
        """Replay (host gap ns, kernel ns) launches on the simulated card, in C: launches
        queue without waiting, bounded by `window_s` of queued device time (None: no bound).
        With `slice_s`, the interposer's device gate: queued launches reach the card a slice
        of device time at a time, each only while the card's gate is open. Returns the
        driver-clock ns at which the first and the last kernel ended."""
        if window_s is not None and window_s <= 0:
            raise ValueError(f"window must be positive, got {window_s} s")
        if slice_s is not None and slice_s <= 0:
            raise ValueError(f"slice must be positive, got {slice_s} s")
        if any(g < 0 or d < 0 for g, d in timeline):
            raise ValueError("host gaps and kernel durations must be >= 0 ns")
        gaps = ffi.new("uint64_t[]", [g for g, _ in timeline])
        durs = ffi.new("uint64_t[]", [d for _, d in timeline])
        first, last = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        window = round(window_s * 1e9) if window_s is not None else 0
        sliced = round(slice_s * 1e9) if slice_s is not None else 0
        replay = lib.qs_sim_replay_gated
        check(self._call(replay, gaps, durs, len(timeline), window, sliced, first, last))
        return int(first[0]), int(last[0])

    def replay_gated(self, timeline: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """`replay` as the CUDA interposer's device gate queues: the window it keeps alone
        (at least QS_LP_WINDOW_ALONE_NS), a slice of QS_LP_DEVICE_GATE_SLICE_NS at a time."""
        window = lp_window_in_force_ns(int(self._call(lib.qs_client_lp_window_ns)), True) / 1e9
        return self.replay(timeline, window, int(lib.QS_LP_DEVICE_GATE_SLICE_NS) / 1e9)

    def account_device_time(self, seconds: float) -> None:
        check(self._call(lib.qs_account_device_time, round(seconds * 1e9)))

    def info(self) -> ClientInfo:
        out = ffi.new("qs_client_info *")
        check(self._call(lib.qs_client_info_get, out))
        return ClientInfo(
            vgpu=int(out.vgpu),
            card=int(out.card),
            card_uuid=text(out.card_uuid),
            priority=Priority(out.priority),
            core_share=int(out.core_share),
            mem_limit=int(out.mem_limit),
            mem_used=int(out.mem_used),
            mem_reserved=int(out.mem_reserved),
            card_total_mem=int(out.card_total_mem),
        )

    @property
    def last_unblock_ns(self) -> int:
        """CLOCK_MONOTONIC ns when the last launch_begin stopped blocking (0: never blocked)."""
        return int(self._call(lib.qs_client_last_unblock_ns))

    @property
    def lp_window_s(self) -> float:
        """Low priority's in-flight window as a launcher applies it now: the card's while a
        high-priority process is attached to the card, else at least 20 ms."""
        return int(self._call(lib.qs_client_lp_window_ns)) / 1e9

    def timed_launch_begin(self) -> tuple[int, int]:
        """launch_begin with the driver's clock read just before and after it, in C."""
        begin, done = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(self._call(lib.qs_bench_timed_begin, begin, done))
        return int(begin[0]), int(done[0])

    def launch_overhead_ns(self, iterations: int = 1_000_000) -> float:
        """C tight-loop cost of launch_begin + launch_end, ns per pair."""
        out = ffi.new("double *")
        check(self._call(lib.qs_bench_launch_overhead, iterations, out))
        return float(out[0])


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns, the driver's clock."""
    return int(lib.qs_now_ns())
