"""The seam between the Kubernetes plugins and the node agent: what cards this node has and
how a vGPU is prepared for, and released from, one consumer (a DRA claim or a pod)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from qshare.contracts.domain import Priority

MIB = 1 << 20


@dataclass(frozen=True)
class CardInfo:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    numa_node: int | None
    policy: str  # best-effort | fixed-share | burst-share


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class LocalVgpu:
    """A vGPU made on this node for one consumer, and what its processes need to use it."""

    key: str
    vgpu_id: int
    card_index: int
    card_uuid: str
    priority: Priority
    core_share: int
    memory_mib: int
    segment: str
    segment_dir: str
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[str, ...] = ()

    def same_shape(self, card_index: int, priority: Priority, core: int, memory_mib: int) -> bool:
        return (self.card_index, self.priority, self.core_share, self.memory_mib) == (
            card_index,
            priority,
            core,
            memory_mib,
        )


@dataclass(frozen=True)
class VgpuWanted:
    """One vGPU a consumer asks for; `policy` (a claim's hint) as `VgpuBackend.prepare`."""

    key: str
    card_index: int
    priority: Priority
    core_share: int
    memory_mib: int
    policy: str | None = None


class Prepared(NamedTuple):
    """One consumer's vGPUs, as `prepare_all` answers: `made` the keys this call created
    (the others were prepared before it), decided under the backend's own lock."""

    vgpus: list[LocalVgpu]
    made: list[str]


class BackendError(Exception):
    """The backend refused a request; the message names what is wrong."""


CardWatcher = Callable[[list[CardInfo]], None]


class VgpuBackend(Protocol):
    """What the plugins need from the node agent. `prepare` is idempotent by `key`; a vGPU
    it returns is on disk (survives a restart of the agent) unless `durable=False`, in which
    case the caller must `save()` before telling anyone the vGPU is ready."""

    def cards(self) -> list[CardInfo]: ...

    def prepare(
        self,
        key: str,
        card_index: int,
        priority: Priority,
        core_share: int,
        memory_mib: int,
        policy: str | None = None,
        *,
        durable: bool = True,
    ) -> LocalVgpu:
        """`policy` (a claim's hint) is set on the card if it has no vGPUs yet; a card
        running vGPUs under another policy refuses it with `BackendError`."""
        ...

    def prepare_all(self, wanted: list[VgpuWanted], *, durable: bool = True) -> Prepared:
        """`prepare` of one consumer's vGPUs, all or none: a save (this call's or any other)
        names every one of them or none, and one the driver refuses gives back the others
        this call made. Says which it made: only those are the caller's to give back."""
        ...

    def save(self) -> None:
        """Return once every change made before this call is on disk; concurrent callers
        share one write. Raises `OSError` when it cannot be written."""
        ...

    def release(self, key: str, *, durable: bool = True) -> None:
        """Destroy the vGPU of `key` (none: nothing to do); on disk when this returns unless
        `durable=False`, in which case the caller must `save()` before saying it is gone."""
        ...

    def prepared(self) -> dict[str, LocalVgpu]: ...

    def watch_cards(self, watcher: CardWatcher) -> Callable[[], None]:
        """Call `watcher(cards)` whenever a card's health or policy changes; returns an
        unsubscribe function."""
        ...
