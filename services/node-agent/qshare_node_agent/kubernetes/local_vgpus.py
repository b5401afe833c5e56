"""`LocalVgpus`: the `VgpuBackend` over the agent's own `qshare_driver.Node`.

vGPUs prepared here take ids 0x80000000..0xFFFFFFFE; the allocator's ids stay below, so both
kinds live in one segment without colliding. Every change is checkpointed next to the
segment; `restore` re-applies the checkpoint to a (possibly new) segment after a restart.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from qshare.contracts.domain import MAX_CORE_SHARE, Priority
from qshare.launcher import find_library
from qshare_driver import layout
from qshare_driver.errors import DriverError, NotFoundError
from qshare_driver.node import Node, Policy
from qshare_node_agent.discovery import Card
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.backend import (
    MIB,
    BackendError,
    CardInfo,
    CardWatcher,
    LocalVgpu,
    Mount,
    Prepared,
    VgpuWanted,
)
from qshare_node_agent.kubernetes.cdi import Recorded
from qshare_node_agent.kubernetes.container_env import vgpu_variable, visible_variable
from qshare_node_agent.metrics import CHECKPOINTS_SET_ASIDE

log = logging.getLogger(__name__)

FIRST_LOCAL_ID = checkpoint.FIRST_LOCAL_ID
LAST_LOCAL_ID = checkpoint.LAST_LOCAL_ID
CONTAINER_LIBRARY = "/usr/lib/qshare/libqshare-cuda.so"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def card_device_nodes(index: int) -> tuple[str, ...]:
    """The card's device nodes that exist on this host (none on a simulated node)."""
    wanted = (f"/dev/nvidia{index}", *CONTROL_DEVICE_NODES)
    return tuple(p for p in wanted if os.path.exists(p))


class LocalVgpus:
    """Prepares vGPUs on `node`'s cards. Thread-safe; `prepare` is idempotent by key."""

    def __init__(
        self,
        node: Node,
        cards: Iterable[Card],
        min_vgpu_mib: int = 1024,
        interposer: Path | None = None,
        device_nodes: Callable[[int], tuple[str, ...]] = card_device_nodes,
        own_policy: Callable[[int], str] | None = None,
    ) -> None:
        """`own_policy(card index)`: the policy a card takes back once no prepared claim
        asks one of it (None: it keeps the last claim's)."""
        self._node = node
        self._own_policy = own_policy
        self._cards = {c.index: c for c in cards}
        self._health = dict.fromkeys(self._cards, True)
        self._min_mib = min_vgpu_mib
        library = interposer or find_library(None, os.environ)
        self._library_mount = None if library is None else Mount(str(library), CONTAINER_LIBRARY)
        self._device_nodes = device_nodes
        self._nodes_of: dict[int, tuple[str, ...]] = {}  # each card's, looked up once
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._generation = 0  # of the in-memory state; bumped by every change
        self._saved = 0  # the generation on disk
        self._vgpus: dict[str, LocalVgpu] = {}
        self._entries: dict[str, str] = {}  # the checkpoint's, serialised once each
        self._asked: dict[str, str] = {}  # the policy each vGPU's claim asked, if any
        self._watchers: list[CardWatcher] = []
        self._told: list[CardInfo] | None = None  # what the watchers were last told
        self.segment_dir = layout.segment_dir(Path(node.directory) if node.directory else None)
        self.checkpoint = node_checkpoint(node)

    # -- cards -------------------------------------------------------------------------
    def cards(self) -> list[CardInfo]:
        return [self._card_info(c) for c in sorted(self._cards.values(), key=lambda c: c.index)]

    def _card_info(self, card: Card) -> CardInfo:
        policy = self._node.card_stats(card.index).policy.label
        healthy = self._health[card.index]
        return CardInfo(
            card.index, card.uuid, card.model, card.memory_mib, healthy, card.numa_node, policy
        )

    def set_health(self, index: int, healthy: bool) -> None:
        """Record a card's health (from NVML or the simulator) and tell the watchers."""
        self._known(index)
        if self._health[index] != healthy:
            self._health[index] = healthy
            self._notify()

    def observe(self, unhealthy: Collection[str]) -> None:
        """Take the cards' health as the agent reads it (`unhealthy`: card UUIDs) and tell
        the watchers when a card's health or policy (which commands and applies change in
        the driver directly) differs from what they were last told."""
        for index, card in self._cards.items():
            self._health[index] = card.uuid not in unhealthy
        cards = self.cards()
        if cards != self._told:
            self._tell(cards)

    def set_policy(self, index: int, policy: Policy | str) -> None:
        self._known(index)
        self._node.set_policy(index, policy)
        self._notify()

    def watch_cards(self, watcher: CardWatcher) -> Callable[[], None]:
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def _notify(self) -> None:
        self._tell(self.cards())

    def _tell(self, cards: list[CardInfo]) -> None:
        self._told = cards
        for watcher in list(self._watchers):
            watcher(cards)

    def _known(self, index: int) -> Card:
        card = self._cards.get(index)
        if card is None:
            raise BackendError(f"card {index} is not on this node (cards: {sorted(self._cards)})")
        return card

    # -- vGPUs -------------------------------------------------------------------------
    def prepared(self) -> dict[str, LocalVgpu]:
        with self._lock:
            return dict(self._vgpus)

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
        """A key prepared already is answered as it is (once on disk, when `durable`)."""
        wanted = VgpuWanted(key, card_index, priority, core_share, memory_mib, policy)
        return self.prepare_all([wanted], durable=durable).vgpus[0]

    def prepare_all(self, wanted: list[VgpuWanted], *, durable: bool = True) -> Prepared:
        """All or none: the missing vGPUs are created in the driver first, then kept
        together, so the checkpoint (written by this call when `durable`, or by any save)
        names all of them or none; a restart destroys those it does not name."""
        with self._lock:
            prepared, switched = self._make_all(wanted)
            generation = self._generation
        if durable:
            self._persist(generation)
        if switched:
            self._notify()
        return prepared

    def _make_all(self, wanted: list[VgpuWanted]) -> tuple[Prepared, bool]:
        """(The caller holds `_lock`.) The vGPUs of `wanted`, and True when a card's policy
        was switched for them; one the driver refuses destroys those this call created."""
        for w in wanted:
            if w.key in self._vgpus:
                self._same(self._vgpus[w.key], w.card_index, w.priority, w.core_share,
                           w.memory_mib)  # fmt: skip
        made: dict[str, LocalVgpu] = {}
        asked = {w.key: Policy.parse(w.policy).label for w in wanted if w.policy is not None}
        switched: dict[int, Policy] = {}  # each card switched, with the policy it had before
        try:
            for w in wanted:
                if w.key not in self._vgpus and w.key not in made:
                    made[w.key], before = self._make(w, {v.vgpu_id for v in made.values()})
                    if before is not None:
                        switched.setdefault(w.card_index, before)
        except Exception:
            self._destroy(made.values())
            self._give_policies(switched)  # what each card had before
            raise
        for vgpu in made.values():
            self._keep(vgpu, asked.get(vgpu.key))
        if made:
            self._changed()
        return Prepared([self._vgpus[w.key] for w in wanted], list(made)), bool(switched)

    def _make(self, w: VgpuWanted, taken: set[int]) -> tuple[LocalVgpu, Policy | None]:
        """Create the vGPU in the segment (an id not in `taken` either), with the policy
        the card had when it was switched for it (None: not switched)."""
        card = self._check(w.card_index, w.core_share, w.memory_mib)
        before = None if w.policy is None else self._apply_policy(card, Policy.parse(w.policy))
        vgpu_id = self._free_id(taken)
        vgpu = self._describe(w.key, vgpu_id, card, Priority(w.priority), w.core_share,
                              w.memory_mib)  # fmt: skip
        self._create(vgpu)
        return vgpu, before

    def _destroy(self, vgpus: Iterable[LocalVgpu]) -> None:
        for vgpu in vgpus:
            with contextlib.suppress(DriverError):
                self._node.destroy_vgpu(vgpu.vgpu_id)

    def _give_policies(self, policies: Mapping[int, Policy]) -> bool:
        """(The caller holds `_lock`.) Give each card its policy in `policies` (one the
        driver refuses is logged); True when a card's policy changed."""
        switched = False
        for index, policy in policies.items():
            try:
                if self._node.card_stats(index).policy != policy:
                    self._node.set_policy(index, policy)
                    switched = True
            except DriverError as exc:
                log.error("card %d could not be given back policy %s: %s", index, policy.label,
                          exc)  # fmt: skip
        return switched

    def _apply_policy(self, card: Card, wanted: Policy) -> Policy | None:
        """Give an empty card the policy a claim asks for, returning the one it had (None:
        unchanged); a card already running vGPUs keeps its policy, and a claim asking
        another is refused."""
        stats = self._node.card_stats(card.index)
        if stats.policy == wanted:
            return None
        if stats.vgpus:
            raise BackendError(
                f"card {card.index} runs {stats.policy.label} with {stats.vgpus} "
                f"other vGPU(s); policy {wanted.label} can only be set on a card "
                f"with no vGPUs"
            )
        self._node.set_policy(card.index, wanted)
        return stats.policy

    def describe(
        self,
        key: str,
        vgpu_id: int,
        card_index: int,
        priority: Priority,
        core: int,
        memory_mib: int,
    ) -> LocalVgpu:
        """What a process needs to use vGPU `vgpu_id`, which someone else created (the node
        agent, for the allocator): the same environment and mounts as a prepared one."""
        return self._describe(key, vgpu_id, self._known(card_index), priority, core, memory_mib)

    def release(self, key: str, *, durable: bool = True) -> None:
        """Destroy the vGPU; a card no claim left asks a policy of takes its own back. One
        the driver refuses to destroy stays prepared (BackendError): a retry destroys it.
        Saved before it returns when `durable`; otherwise by the caller's `save()`."""
        with self._lock:
            vgpu = self._vgpus.get(key)
            if vgpu is None:
                return
            self._destroy_one(vgpu)
            del self._vgpus[key], self._entries[key]
            switched = self._asked.pop(key, None) is not None and self._unasked(vgpu.card_index)
            generation = self._changed()
        if durable:
            self._persist(generation)
        if switched:
            self._notify()

    def _destroy_one(self, vgpu: LocalVgpu) -> None:
        try:
            self._node.destroy_vgpu(vgpu.vgpu_id)
        except NotFoundError:
            return  # gone already
        except DriverError as exc:
            raise BackendError(f"the driver refused to destroy {vgpu.key}: {exc}") from None

    def own_policies_changed(self, indexes: Iterable[int]) -> None:
        """The cards `indexes` have another own policy now (the node's label changed): each
        takes it, unless a prepared claim asks one of it."""
        with self._lock:
            switched = [index for index in indexes if self._unasked(index)]
        if switched:
            self._notify()

    def _unasked(self, index: int) -> bool:
        """(The caller holds `_lock`.) Give card `index` its own policy back unless a kept
        claim still asks one of it; True when its policy changed."""
        if self._own_policy is None or any(self._vgpus[k].card_index == index for k in self._asked):
            return False
        try:
            own = self._own_policy(index)
            if self._node.card_stats(index).policy.label == own:
                return False
            self._node.set_policy(index, own)
        except (DriverError, ValueError) as exc:
            log.error("card %d could not take its own policy back: %s", index, exc)
            return False
        log.info("card %d takes its own policy %s back: no claim asks one of it", index, own)
        return True

    def restore(self, recorded: Callable[[], Mapping[int, Recorded]] = dict) -> list[str]:
        """Re-apply the checkpoint: keep vGPUs the segment still has, re-create the missing
        ones with their old ids, destroy the local vGPUs it does not name (made by a prepare
        that was never saved, so never answered). Returns the keys that could not be
        restored (and dropped).

        A checkpoint that cannot be used is set aside, and what it held is rebuilt from
        `recorded` (vGPU id -> key and policy, read from the claims' CDI specs) and the
        segment; the cards get back the policies the rebuilt claims asked (the segment's
        adoption, reading no usable checkpoint, gave them the agent's)."""
        lost: list[str] = []
        with self._lock:
            entries, rebuilt = self._saved_entries(recorded)
            for entry in entries:
                try:
                    card = self._known(entry.card_index)
                    vgpu = self._describe(
                        entry.key,
                        entry.vgpu_id,
                        card,
                        entry.priority,
                        entry.core_share,
                        entry.memory_mib,
                    )
                    if not self._matches_segment(vgpu):
                        self._create(vgpu)
                    self._keep(vgpu, entry.policy)
                except BackendError:
                    lost.append(entry.key)
            self._drop_unsaved()
            switched = rebuilt and self._give_policies(_asked_by_card(entries, self._vgpus))
            generation = self._changed()
        self._persist(generation)
        if switched:
            self._notify()
        return lost

    def _saved_entries(
        self, recorded: Callable[[], Mapping[int, Recorded]]
    ) -> tuple[list[checkpoint.Entry], bool]:
        """The checkpoint's entries, or those rebuilt from `recorded` (True)."""
        try:
            return checkpoint.load(self.checkpoint, self._node.name), False
        except checkpoint.CheckpointError as exc:
            CHECKPOINTS_SET_ASIDE.labels(node=self._node.name).inc()
            try:
                where = f"moved to {checkpoint.set_aside(self.checkpoint)}"
            except OSError as move:
                where = f"could not be moved aside ({move.strerror}); it will be overwritten"
            log.error("%s; %s; rebuilding it from the segment and the CDI specs", exc, where)
            return self._rebuilt(recorded()), True

    def _rebuilt(self, recorded: Mapping[int, Recorded]) -> list[checkpoint.Entry]:
        """Entries for the local vGPUs the segment holds and a CDI spec names."""
        entries = (self._rebuilt_entry(vgpu_id, spec) for vgpu_id, spec in recorded.items())
        return [e for e in entries if e is not None]

    def _rebuilt_entry(self, vgpu_id: int, spec: Recorded) -> checkpoint.Entry | None:
        """None when the segment has no such local vGPU, or one no prepare could make."""
        if not FIRST_LOCAL_ID <= vgpu_id <= LAST_LOCAL_ID:
            return None
        try:
            stats = self._node.vgpu_stats(vgpu_id)
            return checkpoint.Entry(
                key=spec.key,
                vgpu_id=vgpu_id,
                card_index=stats.card,
                priority=Priority(stats.priority.name.lower()),
                core_share=stats.core_share,
                memory_mib=stats.mem_limit // MIB,
                policy=spec.policy,
            )
        except NotFoundError:
            return None
        except ValidationError as exc:
            log.warning("vGPU %d (%s) is not one a prepare makes; dropped: %s", vgpu_id,
                        spec.key, exc.errors()[0]["msg"])  # fmt: skip
            return None

    def _drop_unsaved(self) -> None:
        kept = {v.vgpu_id for v in self._vgpus.values()}
        for vgpu_id in self._node.list_vgpus():
            if vgpu_id >= FIRST_LOCAL_ID and vgpu_id not in kept:
                with contextlib.suppress(NotFoundError):
                    self._node.destroy_vgpu(vgpu_id)

    def _keep(self, vgpu: LocalVgpu, policy: str | None = None) -> None:
        self._vgpus[vgpu.key] = vgpu
        self._entries[vgpu.key] = _entry(vgpu, policy)
        if policy is not None:
            self._asked[vgpu.key] = policy

    def _same(
        self, vgpu: LocalVgpu, card_index: int, priority: Priority, core: int, memory_mib: int
    ) -> LocalVgpu:
        if vgpu.same_shape(card_index, priority, core, memory_mib):
            return vgpu
        raise BackendError(
            f"{vgpu.key} is already prepared as card {vgpu.card_index}, {vgpu.priority.value}, "
            f"{vgpu.core_share}% and {vgpu.memory_mib} MiB; it cannot change shape"
        )

    def _check(self, card_index: int, core_share: int, memory_mib: int) -> Card:
        card = self._known(card_index)
        if not self._health[card_index]:
            raise BackendError(f"card {card_index} ({card.uuid}) is unhealthy")
        if not 1 <= core_share <= MAX_CORE_SHARE:
            raise BackendError(f"cores must be 1-{MAX_CORE_SHARE} percent, got {core_share}")
        if not self._min_mib <= memory_mib <= card.memory_mib:
            raise BackendError(
                f"memory must be {self._min_mib}-{card.memory_mib} MiB on card {card_index}, "
                f"got {memory_mib} MiB"
            )
        return card

    def _free_id(self, taken: set[int]) -> int:
        used = taken | {v.vgpu_id for v in self._vgpus.values()}
        start = FIRST_LOCAL_ID + len(used)
        ids = itertools.chain(range(start, LAST_LOCAL_ID + 1), range(FIRST_LOCAL_ID, start))
        for candidate in ids:
            if candidate not in used:
                return candidate
        raise BackendError("no local vGPU id is free")

    def _create(self, vgpu: LocalVgpu) -> None:
        try:
            self._node.create_vgpu(
                vgpu.vgpu_id,
                vgpu.card_index,
                vgpu.priority.value,
                vgpu.core_share,
                vgpu.memory_mib * MIB,
            )
        except DriverError as exc:
            raise BackendError(f"the driver refused {vgpu.key}: {exc}") from None

    def _matches_segment(self, vgpu: LocalVgpu) -> bool:
        try:
            stats = self._node.vgpu_stats(vgpu.vgpu_id)
        except NotFoundError:
            return False
        if stats.card != vgpu.card_index or stats.mem_limit != vgpu.memory_mib * MIB:
            raise BackendError(f"segment holds vGPU {vgpu.vgpu_id} with another shape")
        return True

    def save(self) -> None:
        with self._lock:
            generation = self._generation
        self._persist(generation)

    def _changed(self) -> int:
        """Count a change of the in-memory state (the caller holds `_lock`)."""
        self._generation += 1
        return self._generation

    def _persist(self, generation: int) -> None:
        """Return once the checkpoint holds `generation` or a later state. Concurrent callers
        share one write (group commit): whoever writes saves everything changed so far."""
        with self._save_lock:
            if self._saved >= generation:
                return
            with self._lock:
                current = self._generation
                entries = list(self._entries.values())
            checkpoint.save(self.checkpoint, self._node.name, entries)
            self._saved = current

    def _describe(
        self, key: str, vgpu_id: int, card: Card, priority: Priority, core: int, memory_mib: int
    ) -> LocalVgpu:
        vgpu = LocalVgpu(
            key,
            vgpu_id,
            card.index,
            card.uuid,
            priority,
            core,
            memory_mib,
            self._node.name,
            str(self.segment_dir),
        )
        return replace(
            vgpu,
            env=self._env(vgpu),
            mounts=self._mounts(vgpu_id),
            device_nodes=self._card_nodes(card.index),
        )

    def _card_nodes(self, index: int) -> tuple[str, ...]:
        nodes = self._nodes_of.get(index)
        if nodes is None:
            nodes = self._nodes_of[index] = self._device_nodes(index)
        return nodes

    def _env(self, vgpu: LocalVgpu) -> dict[str, str]:
        return {
            "QSHARE_VGPU": str(vgpu.vgpu_id),
            vgpu_variable(vgpu.vgpu_id): vgpu.card_uuid,
            "QSHARE_SEGMENT": vgpu.segment,
            "QSHARE_SHM_DIR": vgpu.segment_dir,
            "LD_PRELOAD": CONTAINER_LIBRARY,
            visible_variable(vgpu.card_index): vgpu.card_uuid,
        }

    def _mounts(self, vgpu_id: int) -> tuple[Mount, ...]:
        """The interposer and the vGPU's attach directory (its socket: the container's only
        way to the driver, see docs/driver.md), at the same path as on the host. Nothing
        of the segment itself is mounted: the owner hands a client its mappings."""
        attach = str(layout.vgpu_dir(self._node.name, vgpu_id, self.segment_dir))
        mounts = (Mount(attach, attach, read_only=False),)
        return mounts if self._library_mount is None else (self._library_mount, *mounts)


def _entry(v: LocalVgpu, policy: str | None) -> str:
    return checkpoint.entry_json(
        checkpoint.Entry(
            key=v.key,
            vgpu_id=v.vgpu_id,
            card_index=v.card_index,
            priority=v.priority,
            core_share=v.core_share,
            memory_mib=v.memory_mib,
            policy=policy,  # a label Policy.parse made
        )
    )


def _asked_by_card(entries: list[checkpoint.Entry], kept: Collection[str]) -> dict[int, Policy]:
    """The policy the kept claims among `entries` asked of each card (the latest wins, as
    `asked_policies`)."""
    return {e.card_index: Policy.parse(e.policy) for e in entries if e.policy and e.key in kept}


def node_checkpoint(node: Node) -> Path:
    """Where the prepared vGPUs of `node`'s segment are checkpointed."""
    directory = layout.segment_dir(Path(node.directory) if node.directory else None)
    return checkpoint.checkpoint_path(directory, node.name)


def asked_policies(node: Node) -> dict[int, str]:
    """The card policy the prepared claims asked of each card, as the checkpoint records it
    (the latest prepared wins); none from a checkpoint that cannot be used (the restore sets
    it aside, rebuilds it with the policies the claims' CDI specs record and gives them back
    to the cards)."""
    try:
        entries = checkpoint.load(node_checkpoint(node), node.name)
    except checkpoint.CheckpointError:
        return {}
    return {e.card_index: e.policy for e in entries if e.policy is not None}
