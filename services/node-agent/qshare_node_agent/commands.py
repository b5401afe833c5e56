"""The node agent's command handlers (`qshare.node.<node>.cmd.<verb>`): each validates its
payload at the edge, acts on the driver, and answers with a typed reply or error."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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


class PolicyCommand(BaseModel):
    """`cmd.policy`: a card's sharing policy, release delay and low-priority device gate,
    changed at run time (the device gate for processes that start launching afterwards)."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(min_length=1, max_length=128)
    policy: CardPolicy | None = None
    release_delay_s: float | None = Field(None, ge=0, le=60)
    lp_device_gate: bool | None = None


class PolicyReply(BaseModel):
    gpu: str
    policy: str
    release_delay_s: float
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
        try:
            if command.policy is not None:
                self._node.set_policy(card.index, command.policy.value)
            if command.release_delay_s is not None:
                self._node.set_release_delay(card.index, command.release_delay_s)
            if command.lp_device_gate is not None:
                self._node.set_lp_device_gate(card.index, command.lp_device_gate)
        except DriverError as error:
            raise InvalidInput.on("policy", str(error)) from error
        stats = self._node.card_stats(card.index)
        policy = CardPolicy.parse(stats.policy.name.lower().replace("_", "-"))
        return PolicyReply(
            gpu=command.gpu,
            policy=policy.value,
            release_delay_s=stats.release_delay_s,
            lp_device_gate=stats.lp_device_gate,
        )
