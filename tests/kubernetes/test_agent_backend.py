"""The node agent's backend for the plugins: a device-plugin pod gets the vGPU the agent
applied for the allocator (never a second one), a DRA claim a vGPU of the node's own, which
the allocator's applies leave alone."""

from __future__ import annotations

import threading
import uuid

import pytest

from qshare.contracts.agent import ApplyDesired, DesiredVgpu
from qshare.contracts.domain import Priority
from qshare_driver.node import Node
from qshare_node_agent.converge import Converger
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.backend import BackendError
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes_wiring import AgentBackend
from qshare_node_agent.segment import UNKNOWN, existing_vgpus

from .conftest import CARDS, wait_for


def converger(node: Node) -> Converger:
    return Converger(node, {c.uuid: c for c in CARDS})


def applied(conv: Converger, node: Node, local_id: int) -> DesiredVgpu:
    vgpu = DesiredVgpu(
        local_id=local_id, id=uuid.uuid4(), claim_id=uuid.uuid4(), gpu=CARDS[1].uuid,
        priority=Priority.LOW, vcore=20, vmemory_mib=2048,
    )  # fmt: skip
    reply = conv.apply(ApplyDesired(node=node.name, generation=1, vgpus=[vgpu]))
    assert reply.applied == [local_id]
    return vgpu


def test_a_device_plugin_pod_gets_the_vgpu_the_agent_applied(node: Node) -> None:
    conv = converger(node)
    vgpu = applied(conv, node, 7)
    backend = AgentBackend(LocalVgpus(node, CARDS), conv)
    found = backend.prepare(f"allocator/{vgpu.id}", 1, Priority.LOW, 20, 2048)
    assert (found.vgpu_id, found.env["QSHARE_VGPU"]) == (7, "7")
    assert node.list_vgpus() == [7]


def test_a_pod_whose_vgpu_is_not_applied_yet_is_told_to_retry(node: Node) -> None:
    backend = AgentBackend(LocalVgpus(node, CARDS), converger(node), apply_wait_s=0.1)
    with pytest.raises(BackendError, match="not applied on this node yet"):
        backend.prepare(f"allocator/{uuid.uuid4()}", 0, Priority.LOW, 20, 2048)


def test_a_pod_whose_vgpu_is_applied_while_allocate_waits_gets_it(node: Node) -> None:
    """The extender binds a pod once its claim is placed; the kubelet's Allocate can come
    before the agent applied the vGPU. Allocate waits for the apply instead of failing the
    pod (the kubelet does not call Allocate again: the pod would fail admission)."""
    conv = converger(node)
    vgpu_id = uuid.uuid4()
    backend = AgentBackend(LocalVgpus(node, CARDS), conv, apply_wait_s=10)
    vgpu = DesiredVgpu(
        local_id=9, id=vgpu_id, claim_id=uuid.uuid4(), gpu=CARDS[1].uuid,
        priority=Priority.LOW, vcore=20, vmemory_mib=2048,
    )  # fmt: skip
    later = threading.Timer(
        0.2, conv.apply, [ApplyDesired(node=node.name, generation=1, vgpus=[vgpu])]
    )
    later.start()
    try:
        found = backend.prepare(f"allocator/{vgpu_id}", 1, Priority.LOW, 20, 2048)
    finally:
        later.join()
    assert found.vgpu_id == 9


def test_a_waiting_allocate_looks_again_only_when_an_apply_happens(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Allocate waits on the converger's applies, not on a clock: while nothing is applied
    it does not look again, and the apply that brings its vGPU answers it."""
    conv = converger(node)
    backend = AgentBackend(LocalVgpus(node, CARDS), conv, apply_wait_s=30)
    looks: list[str] = []
    look = backend._applied
    monkeypatch.setattr(backend, "_applied", lambda *a: looks.append("look") or look(*a))
    vgpu = DesiredVgpu(
        local_id=11, id=uuid.uuid4(), claim_id=uuid.uuid4(), gpu=CARDS[1].uuid,
        priority=Priority.LOW, vcore=20, vmemory_mib=2048,
    )  # fmt: skip
    answers: list[int] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            backend.prepare(f"allocator/{vgpu.id}", 1, Priority.LOW, 20, 2048).vgpu_id
        )
    )
    waiter.start()
    wait_for(lambda: len(looks) == 1)
    waiter.join(0.5)  # a 50 ms poll would have looked about ten times meanwhile
    assert len(looks) == 1
    conv.apply(ApplyDesired(node=node.name, generation=1, vgpus=[]))  # not its vGPU yet
    wait_for(lambda: len(looks) == 2)
    conv.apply(ApplyDesired(node=node.name, generation=2, vgpus=[vgpu]))
    waiter.join(10)
    assert answers == [11]
    assert len(looks) == 3


def test_a_dra_claims_vgpu_survives_the_allocators_next_apply(node: Node) -> None:
    conv = converger(node)
    backend = AgentBackend(LocalVgpus(node, CARDS), conv)
    claim = backend.prepare("claim/ns/name/uid", 0, Priority.HIGH, 30, 4096)
    assert claim.vgpu_id >= 0x80000000
    applied(conv, node, 7)
    assert sorted(node.list_vgpus()) == [7, claim.vgpu_id]


def test_a_dra_vgpu_prepared_unsaved_reaches_the_checkpoint_on_save(node: Node) -> None:
    local = LocalVgpus(node, CARDS)
    backend = AgentBackend(local, converger(node))
    backend.prepare("dra/uid/gpu/gpu-0/s", 0, Priority.LOW, 30, 4096, durable=False)
    assert checkpoint.load(local.checkpoint, node.name) == []
    backend.save()
    assert [e.key for e in checkpoint.load(local.checkpoint, node.name)] == ["dra/uid/gpu/gpu-0/s"]


def test_an_adopted_vgpu_no_apply_has_named_yet_is_no_pods(node: Node) -> None:
    """A restarted agent holds its segment's vGPUs under the nil UUID until the allocator's
    first apply names them: a pod whose annotation names the nil UUID (a guess anyone can
    write) must not get another claim's vGPU."""
    node.create_vgpu(7, 1, "low", 20, 2048 << 20)
    conv = converger(node)
    conv.adopt(existing_vgpus(node, CARDS))
    backend = AgentBackend(LocalVgpus(node, CARDS), conv, apply_wait_s=0.1)
    with pytest.raises(BackendError, match="not applied on this node yet"):
        backend.prepare(f"allocator/{UNKNOWN}", 1, Priority.LOW, 20, 2048)
