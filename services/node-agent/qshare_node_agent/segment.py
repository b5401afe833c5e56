"""Opening the node's driver segment: adopt the one a previous agent left (its workloads keep
running and limited), or create it with the discovered cards (replacing one an agent of
another driver layout left, once nothing uses it); either way each card then takes
this agent's policy, release delay (fixed or auto) and device gate; an adopted card that a
prepared DRA claim asked a policy of keeps that policy while the claim holds it."""

from __future__ import annotations

import logging
import uuid

from qshare.contracts.agent import LOCAL_ID_LIMIT, DesiredVgpu
from qshare.contracts.domain import CardPolicy, Priority
from qshare_driver import Node, NotFoundError, SegmentMismatchError
from qshare_node_agent.discovery import Card
from qshare_node_agent.settings import NodeAgentSettings
from qshare_node_agent.stale_segment import check_replaceable

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
    except SegmentMismatchError as error:  # an earlier driver's layout (stale_segment)
        check_replaceable(settings.shm_dir, settings.segment_name, str(error))
        return _create(settings, cards, replace=True), False
    try:  # settings changed for this start (a new ConfigMap) apply to the adopted cards too
        asked = _claims_policies(node) if settings.kubernetes else {}
        for index in node.list_cards():
            configure_card(node, index, with_policy(settings, asked.get(index)))
    except Exception:
        node.leave()
        raise
    log.info("segment %s adopted with vGPUs %s", settings.segment_name, node.list_vgpus())
    return node, True


def _claims_policies(node: Node) -> dict[int, str]:
    from qshare_node_agent.kubernetes.local_vgpus import asked_policies

    return asked_policies(node)


def with_policy(settings: NodeAgentSettings, policy: str | None) -> NodeAgentSettings:
    """The settings with `policy` (a live DRA claim's, the node label's) in place of the
    agent's own; the settings as they are for None."""
    if policy is None:
        return settings
    return settings.model_copy(update={"policy": CardPolicy(policy)})


def _create(settings: NodeAgentSettings, cards: list[Card], replace: bool = False) -> Node:
    node = Node.create(settings.segment_name, settings.shm_dir, replace=replace)
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
    """Give card `index` the settings' policy, release, LP window and device gate, changing
    only what differs: an adopted card's workloads keep their sharing epoch and auto's
    learned gaps."""
    stats = node.card_stats(index)
    if stats.policy.label != settings.policy.value:
        node.set_policy(index, settings.policy.value)
    if _ns(stats.release_delay_s) != _ns(settings.release_delay_s):
        node.set_release_delay(index, settings.release_delay_s)
    _configure_release(node, index, settings)
    if _ns(stats.lp_window_s) != _ns(settings.lp_window_s):
        node.set_lp_window(index, settings.lp_window_s)
    if stats.lp_device_gate != settings.lp_device_gate:
        node.set_lp_device_gate(index, settings.lp_device_gate)


def _configure_release(node: Node, index: int, settings: NodeAgentSettings) -> None:
    auto, bound = node.release_auto(index), settings.release_auto_bound_s
    if bound is None:
        if auto.enabled:
            node.set_release_fixed(index)
        return
    wanted = (True, _ns(bound), _ns(settings.release_delay_s))
    if (auto.enabled, _ns(auto.p99_bound_s), _ns(auto.max_delay_s)) != wanted:
        node.set_release_auto(index, bound, settings.release_delay_s)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


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
            suspended=stats.suspended,
        )  # fmt: skip
    return found
