"""Opening the node's driver segment: adopt the one a previous agent left (its workloads keep
running and limited), or create it with the discovered cards, policy and release delay."""

from __future__ import annotations

import logging

from qshare_driver import Node
from qshare_node_agent.discovery import Card
from qshare_node_agent.settings import NodeAgentSettings

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def open_segment(settings: NodeAgentSettings, cards: list[Card]) -> Node:
    node = Node.create(settings.segment_name, settings.shm_dir, replace=True)
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
