"""Setting the cards' compute timeslice (how long the GPU runs one process's work before
switching to another's) with `nvidia-smi compute-policy` at the agent's start, as
QSHARE_NODE_TIMESLICE asks, or on one card as asked over REST, and what each card was left
with."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from qshare import gpu_timeslice
from qshare.contracts.sharing import REASON_MAX, Timeslice
from qshare.gpu_timeslice import TIMEOUT_S, Outcome
from qshare_node_agent import metrics
from qshare_node_agent.settings import NodeAgentSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CardTimeslice:
    """A card's timeslice as the agent left it (its heartbeats report it): `level` in force
    (`driver`: the agent set none) and, when the card did not take the level asked, `refused`
    naming it and why."""

    level: Timeslice = "driver"
    refused: str | None = None


def set_timeslice(
    program: str, uuids: Sequence[str], level: Timeslice, timeout_s: float = TIMEOUT_S
) -> list[Outcome]:
    """Set `level` on each card (qshare.gpu_timeslice); nothing with `driver`."""
    if level == "driver":
        return []
    return gpu_timeslice.set_timeslice(program, uuids, level, timeout_s)


def apply(settings: NodeAgentSettings, uuids: Sequence[str]) -> dict[str, CardTimeslice]:
    """The agent's start: set the setting's timeslice on its real cards (blocking; run it in
    a thread), logging each card that refused it. Simulated cards are left alone. Each
    card's timeslice as it was left, by UUID."""
    if settings.timeslice == "driver":
        return {uuid: CardTimeslice() for uuid in uuids}
    if settings.simulate is not None:
        log.info("node agent %s: timeslice %r not applied to simulated cards", settings.name,
                 settings.timeslice)  # fmt: skip
        refused = _refusal(settings.timeslice, "not applied to simulated cards")
        return {uuid: refused for uuid in uuids}
    outcomes = set_timeslice(settings.nvidia_smi, uuids, settings.timeslice)
    for outcome in outcomes:
        _tell(settings, outcome)
    return {o.uuid: _left(settings.timeslice, o) for o in outcomes}


def give_timeslice(
    settings: NodeAgentSettings, uuid: str, level: Timeslice, withdrawn: bool = False
) -> CardTimeslice:
    """Set `level` on one card as asked over REST, or, `withdrawn`, as the agent's own level
    given back (blocking: nvidia-smi runs): the card's timeslice as left, `refused` naming the
    level and why. Simulated cards refuse what is asked; nothing was ever set on them, so a
    withdrawal leaves them as the agent's start did."""
    if settings.simulate is not None:
        if withdrawn:
            return apply(settings, [uuid])[uuid]
        return _refusal(level, "not applied to simulated cards")
    if level == "driver":
        return CardTimeslice()
    outcome = gpu_timeslice.set_timeslice(settings.nvidia_smi, [uuid], level)[0]
    if outcome.error is None:
        log.info("node agent %s: card %s: timeslice set to %r as asked", settings.name, uuid, level)
    else:
        log.warning("node agent %s: card %s: timeslice %r as asked not set: %s", settings.name,
                    uuid, level, outcome.error)  # fmt: skip
    return _left(level, outcome)


def _left(level: Timeslice, outcome: Outcome) -> CardTimeslice:
    if outcome.error is None:
        return CardTimeslice(level)
    return _refusal(level, outcome.error)


def _refusal(level: Timeslice, why: str) -> CardTimeslice:
    return CardTimeslice(refused=f"{level}: {why}"[:REASON_MAX])


def _tell(settings: NodeAgentSettings, outcome: Outcome) -> None:
    """One card's outcome in the metrics and the log."""
    metrics.TIMESLICE_SET.labels(settings.name, outcome.uuid, settings.timeslice).set(
        0 if outcome.error else 1
    )
    if outcome.error is not None:
        log.warning("node agent %s: card %s: timeslice %r (QSHARE_NODE_TIMESLICE) not set: "
                    "%s", settings.name, outcome.uuid, settings.timeslice,
                    outcome.error)  # fmt: skip
    else:
        log.info("node agent %s: card %s: timeslice set to %r", settings.name,
                 outcome.uuid, settings.timeslice)  # fmt: skip
