"""The node agent's convergence applies one desired set in an order the driver accepts: every
vGPU that shrinks before any that grows, so room one claim gives is there for another."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from qshare.contracts.agent import ApplyDesired, DesiredVgpu
from qshare.contracts.domain import Priority
from qshare_driver import EventKind, Node
from qshare_driver import Priority as DriverPriority
from qshare_node_agent.converge import Converger
from qshare_node_agent.discovery import Card

CARD = Card(0, "GPU-converge-0", "qshare-simulated", 16384, 0)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with Node.create(f"conv-{os.getpid()}", tmp_path) as created:
        created.add_card(CARD.index, CARD.uuid, CARD.memory_mib << 20)
        yield created


def _vgpu(local_id: int, vcore: int, claim: uuid.UUID) -> DesiredVgpu:
    return DesiredVgpu(
        local_id=local_id, id=claim, claim_id=claim, gpu=CARD.uuid,
        priority=Priority.LOW, vcore=vcore, vmemory_mib=2048,
    )  # fmt: skip


def _two_vgpus_filling_the_card(node: Node) -> tuple[Converger, uuid.UUID, uuid.UUID]:
    """A converger that applied vGPU 1 at 40 % and vGPU 2 at 60 % of the card's core."""
    conv = Converger(node, {CARD.uuid: CARD})
    first, second = uuid.uuid4(), uuid.uuid4()
    vgpus = [_vgpu(1, 40, first), _vgpu(2, 60, second)]
    assert conv.apply(ApplyDesired(node=node.name, generation=1, vgpus=vgpus)).refused == []
    return conv, first, second


def test_one_apply_that_shrinks_one_vgpu_and_grows_another_into_its_room_is_applied(
    node: Node,
) -> None:
    conv, first, second = _two_vgpus_filling_the_card(node)
    regrown = [_vgpu(1, 70, first), _vgpu(2, 30, second)]  # id 1 grows into what id 2 gives
    reply = conv.apply(ApplyDesired(node=node.name, generation=2, vgpus=regrown))
    assert reply.refused == []
    assert (node.vgpu_stats(1).core_share, node.vgpu_stats(2).core_share) == (70, 30)


def test_a_vgpu_whose_core_shrinks_while_its_memory_grows_gives_its_core_before_another_grows(
    node: Node,
) -> None:
    conv, first, second = _two_vgpus_filling_the_card(node)
    bigger = _vgpu(2, 30, second).model_copy(update={"vmemory_mib": 4096})
    regrown = [_vgpu(1, 70, first), bigger]  # id 2 gives core share but takes more memory
    reply = conv.apply(ApplyDesired(node=node.name, generation=2, vgpus=regrown))
    assert reply.refused == []
    assert (node.vgpu_stats(1).core_share, node.vgpu_stats(2).core_share) == (70, 30)
    assert node.vgpu_stats(2).mem_limit == 4096 << 20


class _NodeNotingCreates(Node):
    """The real driver, noting whether each vGPU is suspended the moment its create returns:
    what a process attaching right then would find."""

    suspended_at_create: dict[int, bool]

    def create_vgpu(
        self,
        vgpu_id: int,
        card: int,
        priority: DriverPriority | str,
        core_share: int,
        mem_limit: int,
        *,
        suspended: bool = False,
    ) -> None:
        super().create_vgpu(vgpu_id, card, priority, core_share, mem_limit, suspended=suspended)
        self.suspended_at_create[vgpu_id] = self.vgpu_stats(vgpu_id).suspended


@pytest.fixture
def noting_node(tmp_path: Path) -> Iterator[_NodeNotingCreates]:
    with _NodeNotingCreates.create(f"convn-{os.getpid()}", tmp_path) as created:
        assert isinstance(created, _NodeNotingCreates)
        created.suspended_at_create = {}
        created.add_card(CARD.index, CARD.uuid, CARD.memory_mib << 20)
        yield created


def test_a_vgpu_held_suspended_is_suspended_before_any_process_can_attach(
    noting_node: _NodeNotingCreates,
) -> None:
    """Before, the converger created it running and suspended it in a second call, so a
    process attaching in between could launch (the driver's side: test_create_suspended)."""
    conv = Converger(noting_node, {CARD.uuid: CARD})
    held = _vgpu(1, 40, uuid.uuid4()).model_copy(update={"suspended": True})
    running = _vgpu(2, 40, uuid.uuid4())
    reply = conv.apply(ApplyDesired(node=noting_node.name, generation=1, vgpus=[held, running]))
    assert reply.refused == []
    assert noting_node.suspended_at_create == {1: True, 2: False}
    assert [e.kind for e in noting_node.events(0.1)].count(EventKind.SUSPENDED) == 1


def test_a_vgpu_held_suspended_that_the_driver_refuses_leaves_nothing(node: Node) -> None:
    """Guard: one create call, so a refusal leaves no vGPU running (what the two calls of
    before made sure of by destroying it again when the suspension failed)."""
    conv = Converger(node, {CARD.uuid: CARD})
    running = _vgpu(1, 60, uuid.uuid4())
    held = _vgpu(2, 60, uuid.uuid4()).model_copy(update={"suspended": True})  # shares: 120
    reply = conv.apply(ApplyDesired(node=node.name, generation=1, vgpus=[running, held]))
    assert [r.local_id for r in reply.refused] == [2]
    assert node.list_vgpus() == [1]
