"""How each of the node's cards is shared now, read from the driver for the heartbeats (the
API serves it with the card: policy, release mode and delay in force, LP window, gate), with
the compute timeslice the agent left it at start."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qshare.contracts.domain import CardPolicy
from qshare.contracts.sharing import CardSharing
from qshare_driver import Node
from qshare_node_agent.discovery import Card
from qshare_node_agent.timeslice import CardTimeslice


def card_sharing(
    node: Node, index: int, gpu: str, timeslice: CardTimeslice | None = None
) -> CardSharing:
    stats, auto = node.card_stats(index), node.release_auto(index)
    timeslice = timeslice or CardTimeslice()
    return CardSharing(
        gpu=gpu,
        policy=CardPolicy(stats.policy.label),
        release_mode="auto" if auto.enabled else "fixed",
        release_delay_s=auto.delay_s,
        release_auto_bound_s=auto.p99_bound_s if auto.enabled else None,
        lp_window_s=stats.lp_window_s,
        lp_device_gate=stats.lp_device_gate,
        timeslice=timeslice.level,
        timeslice_refused=timeslice.refused,
    )


def cards_sharing(
    node: Node, cards: Iterable[Card], timeslices: Mapping[str, CardTimeslice]
) -> list[CardSharing]:
    """`card_sharing` of each card (heartbeats, and the answer to an apply)."""
    return [card_sharing(node, c.index, c.uuid, timeslices.get(c.uuid)) for c in cards]
