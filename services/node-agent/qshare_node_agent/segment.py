"""Opening the node's driver segment: adopt the one a previous agent left (its workloads keep
running and limited), or create it with the discovered cards, policy and release delay."""

from __future__ import annotations

import logging
import uuid

from qshare.contracts.agent import LOCAL_ID_LIMIT, DesiredVgpu
from qshare.contracts.domain import Priority
from qshare_driver import Node, NotFoundError
from qshare_node_agent.discovery import Card
from qshare_node_agent.settings import NodeAgentSettings

log = logging.getLogger(__name__)
MIB = 1024 * 1024
UNKNOWN = uuid.UUID(int=0)
"""Ids of an adopted vGPU until the allocator's next apply names it again."""


def open_segment(settings: NodeAgentSettings, cards: list[Card]) -> tuple[Node, bool]:
    """The segment and whether it was adopted (True) or created (False)."""
    try:
        node = Node.adopt(settings.segment_name, settings.shm_dir)
    except NotFoundError:
        return _create(settings, cards), False
    log.info("segment %s adopted with vGPUs %s", settings.segment_name, node.list_vgpus())
    return node, True


def _create(settings: NodeAgentSettings, cards: list[Card]) -> Node:
    node = Node.create(settings.segment_name, settings.shm_dir)
    try:
        for card in cards:
            node.add_card(card.index, card.uuid, card.memory_mib * MIB)
            configure_card(node, card.index, settings)
    except Exception:
        node.close()
        raise
    log.info("segment %s created with %d cards", settings.segment_name, len(cards))
    return node


def configure_card(node: Node, index: int, settings: NodeAgentSettings) -> None:
    node.set_policy(index, settings.policy.value)
    node.set_release_delay(index, settings.release_delay_s)
    node.set_lp_device_gate(index, settings.lp_device_gate)


def existing_vgpus(node: Node, cards: list[Card]) -> dict[int, DesiredVgpu]:
    """The allocator's vGPUs an adopted segment holds, as the agent records applied ones."""
    uuids = {c.index: c.uuid for c in cards}
    found: dict[int, DesiredVgpu] = {}
    for local_id in node.list_vgpus():
        stats = node.vgpu_stats(local_id)
        if local_id >= LOCAL_ID_LIMIT or stats.card not in uuids:
            continue
        found[local_id] = DesiredVgpu(
            local_id=local_id, id=UNKNOWN, claim_id=UNKNOWN, gpu=uuids[stats.card],
            priority=Priority.HIGH if stats.priority.value else Priority.LOW,
            vcore=stats.core_share, vmemory_mib=stats.mem_limit // MIB,
        )  # fmt: skip
    return found
