"""The node agent's command handlers (`qshare.node.<node>.cmd.<verb>`): each validates its
payload at the edge, acts on the driver, and answers with a typed reply or error."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qshare.contracts.agent import (
    ApplyDesired,
    ApplyReply,
    RegisterCommand,
    SuspendCommand,
    SuspendReply,
)
from qshare.contracts.domain import CardPolicy
from qshare.contracts.errors import InvalidInput, NotFound
from qshare_driver import DriverError, Node, NotFoundError
from qshare_node_agent import metrics
from qshare_node_agent.converge import Converger
from qshare_node_agent.sharing import card_sharing


class PolicyCommand(BaseModel):
    """`cmd.policy`: a card's sharing policy, release delay (fixed, or `auto` with a bound on
    what it may add to high priority's p99, choosing up to the release delay), low priority's
    window of work in flight and device gate, changed at run time (the device gate for
    processes that start launching afterwards). What is left out stays as it is."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(min_length=1, max_length=128)
    policy: CardPolicy | None = None
    release_delay_s: float | None = Field(None, ge=0, le=60)
    release_mode: Literal["fixed", "auto"] | None = None
    release_auto_bound_s: float | None = Field(None, gt=0, le=1)
    lp_window_s: float | None = Field(None, ge=1e-6, le=1.0)
    lp_device_gate: bool | None = None

    @model_validator(mode="after")
    def _bound_goes_with_auto(self) -> PolicyCommand:
        if self.release_auto_bound_s is not None and self.release_mode != "auto":
            raise ValueError("release_auto_bound_s goes with release_mode auto")
        return self


class PolicyReply(BaseModel):
    gpu: str
    policy: str
    release_delay_s: float
    release_mode: Literal["fixed", "auto"] = "fixed"
    release_auto_bound_s: float | None = None
    release_delay_in_force_s: float = 0.0  # auto's choice in auto mode, else release_delay_s
    lp_window_s: float = 0.0
    lp_device_gate: bool = False


class Commands:
    def __init__(self, name: str, node: Node, converger: Converger) -> None:
        self._name = name
        self._node = node
        self.converger = converger

    def payload_type(self, verb: str) -> type[BaseModel]:
        types: dict[str, type[BaseModel]] = {
            "apply": ApplyDesired,
            "suspend": SuspendCommand,
            "resume": SuspendCommand,
            "policy": PolicyCommand,
            "register": RegisterCommand,  # the agent itself answers it (it registers again)
        }
        if verb not in types:
            raise NotFound(f"unknown command {verb!r}: use {', '.join(types)}")
        return types[verb]

    def handle(self, verb: str, payload: Any) -> BaseModel:
        if verb == "apply":
            return self.apply(payload)
        if verb == "policy":
            return self.policy(payload)
        return self.suspend(payload, resume=verb == "resume")

    def apply(self, desired: ApplyDesired) -> ApplyReply:
        if desired.node != self._name:
            raise InvalidInput.on("node", f"this is node {self._name}, not {desired.node}")
        started = time.perf_counter()
        reply = self.converger.apply(desired)
        metrics.APPLY_SECONDS.labels(self._name).observe(time.perf_counter() - started)
        metrics.APPLIES.labels(self._name, "refused" if reply.refused else "ok").inc()
        return reply

    def suspend(self, command: SuspendCommand, resume: bool) -> SuspendReply:
        act = self._node.resume if resume else self._node.suspend
        done, missing = [], []
        for local_id in command.local_ids:
            try:
                act(local_id)
                done.append(local_id)
            except NotFoundError:
                missing.append(local_id)
        return SuspendReply(done=done, missing=missing)

    def policy(self, command: PolicyCommand) -> PolicyReply:
        card = self.converger.cards.get(command.gpu)
        if card is None:
            raise InvalidInput.on("gpu", f"no card {command.gpu} on node {self._name}")
        release = self._release(card.index, command)  # refused before anything changes
        try:
            if command.policy is not None:
                self._node.set_policy(card.index, command.policy.value)
            if command.release_delay_s is not None:
                self._node.set_release_delay(card.index, command.release_delay_s)
            release()
            if command.lp_window_s is not None:
                self._node.set_lp_window(card.index, command.lp_window_s)
            if command.lp_device_gate is not None:
                self._node.set_lp_device_gate(card.index, command.lp_device_gate)
        except DriverError as error:
            raise InvalidInput.on("policy", str(error)) from error
        return self._policy_reply(command.gpu, card.index)

    def _release(self, index: int, command: PolicyCommand) -> Callable[[], None]:
        """What the command does to the card's release mode, checked against its state."""
        auto = self._node.release_auto(index)
        mode = command.release_mode or ("auto" if auto.enabled else "fixed")
        if mode == "fixed":
            return (lambda: self._node.set_release_fixed(index)) if auto.enabled else _nothing
        if command.release_mode is None and command.release_delay_s is None:
            return _nothing  # auto goes on as it is
        bound = command.release_auto_bound_s or (auto.p99_bound_s if auto.enabled else None)
        if bound is None:
            raise InvalidInput.on("release_auto_bound_s", "needed to turn auto release on")
        delay = command.release_delay_s
        delay = self._node.card_stats(index).release_delay_s if delay is None else delay
        if delay == 0:
            raise InvalidInput.on(
                "release_delay_s", "auto release needs a release delay above 0 (its longest)"
            )
        return lambda: self._node.set_release_auto(index, bound, delay)

    def _policy_reply(self, gpu: str, index: int) -> PolicyReply:
        """The card as the heartbeats report it, and its fixed delay beside the one in force."""
        now = card_sharing(self._node, index, gpu)
        return PolicyReply(
            **now.model_dump(mode="json", exclude={"release_delay_s"}),
            release_delay_s=self._node.card_stats(index).release_delay_s,
            release_delay_in_force_s=now.release_delay_s,
        )


def _nothing() -> None:
    return None
