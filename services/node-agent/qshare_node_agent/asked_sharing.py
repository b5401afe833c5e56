"""Gives each card the sharing the allocator's desired state asks of it (an admin's request
over REST), or this agent's settings where it asks none, with the policy the Node's label
`qshare.io/policy` names in place of the agent's. A card is changed only when what is asked
of it changes, so a `cmd.policy` given in between stays until then. A timeslice asked is set
with nvidia-smi (asked_timeslice.py)."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from qshare.contracts.domain import CardPolicy
from qshare.contracts.errors import InvalidInput
from qshare.contracts.sharing import (
    CardSharing,
    SharingRefusal,
    SharingSettings,
    Timeslice,
    WantedSharing,
)
from qshare_driver import DriverError, Node
from qshare_node_agent.asked_timeslice import timeslice_to_give
from qshare_node_agent.discovery import Card
from qshare_node_agent.segment import configure_card, with_policy
from qshare_node_agent.settings import NodeAgentSettings
from qshare_node_agent.sharing import cards_sharing
from qshare_node_agent.timeslice import CardTimeslice, give_timeslice

log = logging.getLogger(__name__)


@dataclass
class SharingKeeper:
    node: Node
    settings: NodeAgentSettings
    cards: dict[str, Card]
    asked: dict[str, SharingSettings] = field(default_factory=dict)
    """What each card was last given; a card not here has the agent's settings."""
    node_policy: CardPolicy | None = None
    """The policy the Node's label `qshare.io/policy` names (None: the agent's setting)."""
    timeslices: dict[str, CardTimeslice] = field(default_factory=dict)
    """Each card's timeslice as the agent left it (at start, or as asked), by UUID."""
    pending_timeslice: Future[None] | None = field(default=None, init=False, repr=False)
    """The last timeslice change asked, done once the card has it (or refused it)."""
    _setter: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def apply(self, wanted: list[WantedSharing]) -> list[SharingRefusal]:
        """Give every card what `wanted` asks (the agent's settings where it asks nothing);
        the cards it could not, each with the reason (asked again at the next apply)."""
        by_card = {w.gpu: w.settings for w in wanted}
        refused = [
            SharingRefusal(gpu=gpu, reason=f"no card {gpu} on this node")
            for gpu in by_card
            if gpu not in self.cards
        ]
        for gpu, card in self.cards.items():
            problem = self._give(gpu, card.index, by_card.get(gpu))
            if problem is not None:
                refused.append(SharingRefusal(gpu=gpu, reason=problem))
        return refused

    def own_policy(self, index: int) -> str:
        """The policy card `index` has from this keeper: what was asked of it, else the node
        label's, else the agent's (what a card takes back once no DRA claim asks one)."""
        gpu = next((g for g, c in self.cards.items() if c.index == index), None)
        asked = None if gpu is None else self.asked.get(gpu)
        return with_asked(self.own_settings(), asked).policy.value

    def own_settings(self) -> NodeAgentSettings:
        """The agent's settings with the node label's policy in place of its own."""
        return with_policy(self.settings, self.node_policy)

    def take_node_policy(self, policy: CardPolicy | None) -> list[int]:
        """Take the node label's policy; the cards whose own policy it changed (by index)."""
        indexes = [c.index for c in self.cards.values()]
        before = [self.own_policy(i) for i in indexes]
        self.node_policy = policy
        return [i for i, old in zip(indexes, before, strict=True) if self.own_policy(i) != old]

    def report(self) -> list[CardSharing]:
        return cards_sharing(self.node, self.cards.values(), self.timeslices)

    def _give(self, gpu: str, index: int, asked: SharingSettings | None) -> str | None:
        if asked == self.asked.get(gpu):
            return None
        try:
            configure_card(self.node, index, with_asked(self.own_settings(), asked))
        except (DriverError, InvalidInput) as error:
            log.warning("card %s: the sharing asked was refused: %s", gpu, error)
            return str(error)
        self._give_timeslice(gpu, asked)
        if asked is None:
            self.asked.pop(gpu, None)
        else:
            self.asked[gpu] = asked
        log.info("card %s now shared as %s", gpu, "asked" if asked else "the agent's settings")
        return None

    def _give_timeslice(self, gpu: str, asked: SharingSettings | None) -> None:
        """Set the timeslice this change asks of the card, if it asks a new one. nvidia-smi
        may take seconds: it runs on the keeper's own thread, one card after another in the
        order asked, never on the agent's event loop; the heartbeats report the outcome."""
        level = timeslice_to_give(self.settings.timeslice, self.asked.get(gpu), asked)
        if level is None:
            return
        if self._setter is None:
            self._setter = ThreadPoolExecutor(1, thread_name_prefix="qshare-timeslice")
        withdrawn = asked is None or asked.timeslice is None
        self.pending_timeslice = self._setter.submit(self._set_timeslice, gpu, level, withdrawn)

    def _set_timeslice(self, gpu: str, level: Timeslice, withdrawn: bool) -> None:
        left = give_timeslice(self.settings, gpu, level, withdrawn)
        kept = self.timeslices.get(gpu, CardTimeslice()).level
        self.timeslices[gpu] = CardTimeslice(kept if left.refused else left.level, left.refused)


def with_asked(settings: NodeAgentSettings, asked: SharingSettings | None) -> NodeAgentSettings:
    """The agent's settings with what is asked of one card in their place (checked whole
    before anything on the card changes)."""
    if asked is None:
        return settings
    update = asked.model_dump(exclude_none=True, exclude={"release_mode", "timeslice"})
    if asked.release_mode == "fixed":
        update["release_auto_bound_s"] = None
    result = settings.model_copy(update=update)  # not validated: checked here
    problem = result.auto_release_problem()
    if problem is not None:
        raise InvalidInput.on("release_delay_s", problem)
    return result
