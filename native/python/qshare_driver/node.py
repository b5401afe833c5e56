"""The node owner's handle: creates the segment, manages cards and vGPUs, reads events."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from qshare_driver._lib import check, ffi, lib, text
from qshare_driver.errors import DriverTimeoutError
from qshare_driver.guarded import Guarded

DEFAULT_RELEASE_DELAY_S = 0.1
EVENT_SLICE_S = 0.2  # longest single wait for an event (see Node.next_event)


class Priority(enum.IntEnum):
    LOW = 0
    HIGH = 1

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown priority {name!r}: use high or low") from None


class Policy(enum.IntEnum):
    BEST_EFFORT = 0
    FIXED_SHARE = 1
    BURST_SHARE = 2

    @classmethod
    def parse(cls, name: str) -> Policy:
        aliases = {"be": "best-effort", "fs": "fixed-share", "bs": "burst-share"}
        key = aliases.get(name, name).replace("-", "_").upper()
        try:
            return cls[key]
        except KeyError:
            raise ValueError(
                f"unknown policy {name!r}: use best-effort, fixed-share or burst-share"
            ) from None

    @property
    def label(self) -> str:
        """The name as users write it (`burst-share`): what `parse` reads."""
        return self.name.lower().replace("_", "-")


class EventKind(enum.IntEnum):
    BUSY = 1
    IDLE = 2
    SUSPENDED = 3
    RESUMED = 4
    OOM = 5
    ATTACH = 6
    DETACH = 7
    CLIENT_DIED = 8


@dataclass(frozen=True)
class Event:
    seq: int
    time_ns: int
    kind: EventKind
    card: int | None
    vgpu: int | None
    pid: int
    value: int


@dataclass(frozen=True)
class VgpuStats:
    id: int
    card: int
    priority: Priority
    core_share: int
    mem_limit: int
    mem_used: int
    device_ns: int
    launches: int
    contexts: int
    suspended: bool


@dataclass(frozen=True)
class CardStats:
    index: int
    uuid: str
    busy: bool
    total_mem: int
    release_delay_s: float
    policy: Policy
    vgpus: int
    episodes: int
    device_ns: int
    lp_window_s: float  # low priority's in-flight window in device time (set_lp_window)
    lp_device_gate: bool  # LP's queued work waits on the gate on the GPU (set_lp_device_gate)
    policy_wakes: int  # times LP's accounting woke the sharing policy's sleepers


_NONE = 0xFFFFFFFF


def _event(ev: Any) -> Event:
    return Event(
        seq=int(ev.seq),
        time_ns=int(ev.time_ns),
        kind=EventKind(ev.kind),
        card=None if ev.card == _NONE else int(ev.card),
        vgpu=None if ev.vgpu == _NONE else int(ev.vgpu),
        pid=int(ev.pid),
        value=int(ev.value),
    )


def _opt_dir(directory: str | Path | None) -> Any:
    return ffi.NULL if directory is None else str(directory).encode()


class Node:
    """Owner of one node segment. Closing it removes the segment."""

    def __init__(self, handle: Any, name: str, directory: str | Path | None) -> None:
        self._guard = Guarded(handle, f"node segment {name!r} is closed")
        self.name = name
        self.directory = directory

    @classmethod
    def create(cls, name: str, directory: str | Path | None = None, replace: bool = False) -> Node:
        out = ffi.new("qs_node **")
        check(lib.qs_node_create(name.encode(), _opt_dir(directory), int(replace), out))
        return cls(out[0], name, directory)

    @classmethod
    def adopt(cls, name: str, directory: str | Path | None = None) -> Node:
        """Take over the existing segment `name` after its owner died (kill -9): its cards and
        vGPUs stay, contexts of live processes stay attached and limited, dead ones are reaped."""
        out = ffi.new("qs_node **")
        check(lib.qs_node_adopt(name.encode(), _opt_dir(directory), out))
        return cls(out[0], name, directory)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(handle, *args)`, counted as in progress so that closing (from any thread) waits
        for it instead of unmapping the segment under it; refused once the node is closed."""
        return self._guard.call(fn, *args)

    def close(self) -> None:
        handle = self._guard.retire()
        if handle is not None:
            lib.qs_node_close(handle)

    def leave(self) -> None:
        """Let go of the segment without removing it: vGPUs and attached processes stay until
        another owner adopts it (`Node.adopt`)."""
        handle = self._guard.retire()
        if handle is not None:
            lib.qs_node_leave(handle)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def list_vgpus(self) -> list[int]:
        """Ids of the segment's vGPUs, in slot order."""
        return self._list(lib.qs_node_list_vgpus)

    def list_cards(self) -> list[int]:
        """Indices of the segment's cards."""
        return self._list(lib.qs_node_list_cards)

    def _list(self, fn: Any) -> list[int]:
        count = ffi.new("uint32_t *")
        check(self._call(fn, ffi.NULL, 0, count))
        cap = int(count[0])
        out = ffi.new("uint32_t[]", max(cap, 1))
        check(self._call(fn, out, cap, count))
        return [int(out[i]) for i in range(min(cap, int(count[0])))]

    def attach_dir(self, vgpu_id: int) -> Path:
        """The directory holding vGPU `vgpu_id`'s attach socket: mount it, at the same path,
        into that vGPU's container and nowhere else."""
        buf = ffi.new("char[]", 512)
        check(self._call(lib.qs_vgpu_attach_dir, vgpu_id, buf, 512))
        return Path(text(buf))

    def add_card(self, index: int, uuid: str, total_mem: int) -> None:
        check(self._call(lib.qs_card_add, index, uuid.encode(), total_mem))

    def set_release_delay(self, card: int, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"release delay must be >= 0 s, got {seconds}")
        check(self._call(lib.qs_card_set_release_delay, card, round(seconds * 1e9)))

    def set_lp_window(self, card: int, seconds: float) -> None:
        """Bound low priority's work in flight on `card` to `seconds` of estimated device time
        per process (what high priority may wait behind when the gate closes); 1 µs .. 1 s."""
        if not 1e-6 <= seconds <= 1.0:
            raise ValueError(f"LP window must be within 1 us .. 1 s, got {seconds} s")
        check(self._call(lib.qs_card_set_lp_window, card, round(seconds * 1e9)))

    def set_lp_device_gate(self, card: int, enabled: bool) -> None:
        """Turn the device gate on `card` on or off for processes that start launching from
        now on (the CUDA interposer reads it when it binds; QSHARE_LP_DEVICE_GATE overrides)."""
        check(self._call(lib.qs_card_set_lp_device_gate, card, 1 if enabled else 0))

    def set_policy(self, card: int, policy: Policy | str) -> None:
        value = Policy.parse(policy) if isinstance(policy, str) else policy
        check(self._call(lib.qs_card_set_policy, card, int(value)))

    def card_stats(self, card: int) -> CardStats:
        out = ffi.new("qs_card_stats *")
        check(self._call(lib.qs_card_stats_get, card, out))
        return CardStats(
            index=int(out.index),
            uuid=text(out.uuid),
            busy=bool(out.busy),
            total_mem=int(out.total_mem),
            release_delay_s=int(out.release_delay_ns) / 1e9,
            policy=Policy(out.policy),
            vgpus=int(out.vgpus),
            episodes=int(out.episodes),
            device_ns=int(out.device_ns),
            lp_window_s=int(out.lp_window_ns) / 1e9,
            lp_device_gate=bool(out.lp_device_gate),
            policy_wakes=int(out.policy_wakes),
        )

    def sleepers(self, card: int) -> dict[str, int]:
        """The card's sleeper counts without the owner's own thread: all 0 when nobody waits."""
        out = ffi.new("qs_card_sleepers *")
        check(self._call(lib.qs_card_sleepers_get, card, out))
        return {
            "gate_sleepers": int(out.gate_sleepers),
            "policy_waiters": int(out.policy_waiters),
            "policy_waiting": int(out.policy_waiting),
        }

    def create_vgpu(
        self,
        vgpu_id: int,
        card: int,
        priority: Priority | str,
        core_share: int,
        mem_limit: int,
        *,
        suspended: bool = False,
    ) -> None:
        """Create a vGPU; `suspended` makes it suspended before any process can attach, so no
        launch passes until `resume` (one call: nothing slips in between create and suspend)."""
        prio = Priority.parse(priority) if isinstance(priority, str) else priority
        spec = ffi.new("qs_vgpu_spec *", [vgpu_id, card, int(prio), core_share, mem_limit])
        flags = lib.QS_VGPU_CREATE_SUSPENDED if suspended else 0
        check(self._call(lib.qs_vgpu_create_flags, spec, flags))

    def update_vgpu(self, vgpu_id: int, core_share: int, mem_limit: int) -> None:
        check(self._call(lib.qs_vgpu_update, vgpu_id, core_share, mem_limit))

    def destroy_vgpu(self, vgpu_id: int) -> None:
        check(self._call(lib.qs_vgpu_destroy, vgpu_id))

    def suspend(self, vgpu_id: int) -> None:
        check(self._call(lib.qs_vgpu_suspend, vgpu_id))

    def resume(self, vgpu_id: int) -> None:
        check(self._call(lib.qs_vgpu_resume, vgpu_id))

    def vgpu_stats(self, vgpu_id: int) -> VgpuStats:
        out = ffi.new("qs_vgpu_stats *")
        check(self._call(lib.qs_vgpu_stats_get, vgpu_id, out))
        return VgpuStats(
            id=int(out.id),
            card=int(out.card),
            priority=Priority(out.priority),
            core_share=int(out.core_share),
            mem_limit=int(out.mem_limit),
            mem_used=int(out.mem_used),
            device_ns=int(out.device_ns),
            launches=int(out.launches),
            contexts=int(out.contexts),
            suspended=bool(out.suspended),
        )

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, waiting up to `timeout` seconds (None: forever); None on timeout.
        The wait goes in slices of at most EVENT_SLICE_S, so that closing the node from another
        thread waits for one slice at most; a wait under way when it closes raises DriverError."""
        out = ffi.new("qs_event *")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = EVENT_SLICE_S if deadline is None else deadline - time.monotonic()
            slice_ms = max(0, round(min(left, EVENT_SLICE_S) * 1000))
            try:
                check(self._call(lib.qs_node_next_event, out, slice_ms))
                return _event(out)
            except DriverTimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def events(self, timeout: float = 0.0) -> Iterator[Event]:
        """Events until none arrives within `timeout` seconds."""
        while (ev := self.next_event(timeout)) is not None:
            yield ev

    @property
    def dropped_events(self) -> int:
        return int(self._call(lib.qs_node_dropped_events))

    def set_release_auto(
        self, card: int, p99_bound_s: float, max_delay_s: float = DEFAULT_RELEASE_DELAY_S
    ) -> None:
        """Let the driver choose the card's release delay from the gaps between high-priority
        bursts: high priority's p99 grows by at most `p99_bound_s`, low priority harvests the
        rest, the delay never exceeds `max_delay_s`."""
        if p99_bound_s < 0 or max_delay_s <= 0:
            raise ValueError(
                f"auto release needs a bound >= 0 s and a maximum delay > 0 s, "
                f"got {p99_bound_s} and {max_delay_s}"
            )
        bound_ns, max_ns = round(p99_bound_s * 1e9), round(max_delay_s * 1e9)
        check(self._call(lib.qs_card_set_release_auto, card, 1, bound_ns, max_ns))

    def set_release_fixed(self, card: int) -> None:
        """Leave auto mode: the card's fixed release delay applies again."""
        check(self._call(lib.qs_card_set_release_auto, card, 0, 0, 0))

    def release_auto(self, card: int) -> ReleaseAuto:
        out = ffi.new("qs_release_auto_stats *")
        check(self._call(lib.qs_card_release_auto_get, card, out))
        return ReleaseAuto(
            enabled=bool(out.enabled),
            delay_s=int(out.delay_ns) / 1e9,
            p99_bound_s=int(out.p99_bound_ns) / 1e9,
            max_delay_s=int(out.max_delay_ns) / 1e9,
            penalty_s=int(out.penalty_ns) / 1e9,
            gaps=int(out.gaps),
        )


@dataclass(frozen=True)
class ReleaseAuto:
    """A card's release mode: in auto mode, the delay the driver chose and why."""

    enabled: bool
    delay_s: float
    p99_bound_s: float
    max_delay_s: float
    penalty_s: float  # estimated wait of a high-priority launch behind low priority
    gaps: int  # gaps between high-priority activity counted so far
