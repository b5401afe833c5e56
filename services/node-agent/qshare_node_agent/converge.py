"""Level-triggered convergence of the driver segment to the allocator's desired vGPU set
(and of its cards to the sharing asked of them: asked_sharing).

The agent remembers what it applied; an apply compares the whole desired set with that and
creates, resizes and destroys vGPUs until they match. A vGPU it cannot create is refused
with the driver's reason and leaves the segment as it was. vGPUs prepared on the node
itself (ids at or above LOCAL_ID_LIMIT) are never touched by an apply. A vGPU the control
plane holds suspended (its `suspended` flag) is created suspended (in the driver's create
itself, so no process attaching meanwhile gets a launch through), and suspended or resumed
when its flag changes from the one last applied (or found in an adopted segment); between
applies the preemptor's own commands suspend and resume it.
`wait_for` lets another thread (the device plugin's Allocate) wait for an apply that holds
what it needs: every apply and adopt notifies the waiters, nothing polls.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from qshare.contracts.agent import LOCAL_ID_LIMIT, ApplyDesired, ApplyReply, DesiredVgpu, Refusal
from qshare.contracts.quantities import format_mib
from qshare_driver import DriverError, Node, NotFoundError
from qshare_node_agent.asked_sharing import SharingKeeper
from qshare_node_agent.discovery import Card

log = logging.getLogger(__name__)
MIB = 1024 * 1024
T = TypeVar("T")


@dataclass
class Converger:
    """Owns the allocator's vGPUs in one segment."""

    node: Node
    cards: dict[str, Card]
    held: dict[int, DesiredVgpu] = field(default_factory=dict)
    generation: int = -1
    sharing: SharingKeeper | None = None
    """Gives the cards the sharing each apply asks (none: applies carry vGPUs only)."""
    _changed: threading.Condition = field(
        default_factory=threading.Condition, init=False, repr=False, compare=False
    )

    def wait_for(self, found: Callable[[], T | None], timeout_s: float) -> T | None:
        """`found()` once it is not None: looked at now and again after each apply or adopt,
        for up to `timeout_s`; None when it never was."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while (result := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return result

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def apply(self, desired: ApplyDesired) -> ApplyReply:
        try:
            return self._apply(desired)
        finally:
            self._notify()

    def _apply(self, desired: ApplyDesired) -> ApplyReply:
        if desired.generation < self.generation:
            return self._reply(desired.node, stale=True)
        wanted = {v.local_id: v for v in desired.vgpus}
        for local_id in [i for i in self.held if i not in wanted]:
            self._destroy(local_id)
        for vgpu in wanted.values():
            self._lower_first(vgpu)
        refused = [r for v in wanted.values() if (r := self._converge_one(v)) is not None]
        self.generation = desired.generation
        reply = self._reply(desired.node, refused=refused)
        if self.sharing is not None:
            reply.sharing_refused = self.sharing.apply(desired.sharing)
            reply.sharing = self.sharing.report()
        return reply

    def new_numbering(self) -> None:
        """The node was deleted from the inventory and registers again: its new row counts
        generations from 0, so any generation is newer than none (the first apply then
        removes the vGPUs of the claims that failed with the deletion)."""
        self.generation = -1

    def adopt(self, existing: dict[int, DesiredVgpu]) -> None:
        """Take over vGPUs found in an adopted segment (after an agent restart)."""
        self.held.update({k: v for k, v in existing.items() if k < LOCAL_ID_LIMIT})
        self._notify()

    def _lower_first(self, vgpu: DesiredVgpu) -> None:
        """Give back everything an apply takes away before anything grows, so a card's sums
        in the driver never pass its limit halfway through an apply: a vGPU that moves to
        another card or priority leaves its old place now, and one that stays is set to the
        smaller of its old and new core share and memory (a share may shrink while the
        memory grows); growths and creations follow."""
        now = self.held.get(vgpu.local_id)
        if now is None:
            return
        try:
            if (now.gpu, now.priority) != (vgpu.gpu, vgpu.priority):
                self._destroy(vgpu.local_id)
                return
            vcore, mib = min(now.vcore, vgpu.vcore), min(now.vmemory_mib, vgpu.vmemory_mib)
            if (vcore, mib) != (now.vcore, now.vmemory_mib):
                self.node.update_vgpu(vgpu.local_id, vcore, mib * MIB)
                self.held[vgpu.local_id] = now.model_copy(
                    update={"vcore": vcore, "vmemory_mib": mib}
                )
        except DriverError as error:  # the full change is tried (and refused) by _place
            log.warning("vGPU %d could not give back first: %s", vgpu.local_id, error)

    def _reply(
        self, node: str, refused: list[Refusal] | None = None, stale: bool = False
    ) -> ApplyReply:
        return ApplyReply(
            node=node,
            generation=self.generation,
            applied=sorted(self.held),
            refused=refused or [],
            stale=stale,
        )

    def _converge_one(self, vgpu: DesiredVgpu) -> Refusal | None:
        problem = self._check(vgpu)
        if problem is not None:
            return Refusal(local_id=vgpu.local_id, reason=problem)
        try:
            self._place(vgpu)
        except DriverError as error:
            log.warning("vGPU %d refused: %s", vgpu.local_id, error)
            return Refusal(local_id=vgpu.local_id, reason=str(error))
        self.held[vgpu.local_id] = vgpu
        return None

    def _check(self, vgpu: DesiredVgpu) -> str | None:
        card = self.cards.get(vgpu.gpu)
        if card is None:
            return f"no card {vgpu.gpu} on this node"
        if vgpu.vmemory_mib > card.memory_mib:
            return (
                f"{format_mib(vgpu.vmemory_mib)} is more than card {vgpu.gpu} has "
                f"({format_mib(card.memory_mib)})"
            )
        return None

    def _place(self, vgpu: DesiredVgpu) -> None:
        now = self.held.get(vgpu.local_id)
        if now is not None and (now.gpu, now.priority) != (vgpu.gpu, vgpu.priority):
            self._destroy(vgpu.local_id)
            now = None
        if now is None:
            self._create(vgpu)
            return
        if (now.vcore, now.vmemory_mib) != (vgpu.vcore, vgpu.vmemory_mib):
            self.node.update_vgpu(vgpu.local_id, vgpu.vcore, vgpu.vmemory_mib * MIB)
        if now.suspended != vgpu.suspended:
            (self.node.suspend if vgpu.suspended else self.node.resume)(vgpu.local_id)

    def _create(self, vgpu: DesiredVgpu) -> None:
        """Create `vgpu`, suspended if it is held so (a node back from a reboot on a new
        segment: its driver knows nothing of the suspensions). One driver call: the vGPU is
        suspended before any process can attach to it, and one the driver refuses leaves
        nothing behind (so it is refused, never left running)."""
        card = self.cards[vgpu.gpu].index
        self.node.create_vgpu(
            vgpu.local_id,
            card,
            vgpu.priority.value,
            vgpu.vcore,
            vgpu.vmemory_mib * MIB,
            suspended=vgpu.suspended,
        )

    def _destroy(self, local_id: int) -> None:
        with contextlib.suppress(NotFoundError):
            self.node.destroy_vgpu(local_id)
        self.held.pop(local_id, None)
