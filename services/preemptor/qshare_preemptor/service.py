"""What the preemptor does with card events and operator requests.

The driver already stops every low-priority context on a card the moment high priority
launches there. What one card cannot see is a gang: a low-priority job whose vGPUs span
several cards (one claim of several cards, or the claims sharing a gang name, across
nodes). When high priority takes any card of a gang, the preemptor suspends the gang's vGPUs
on its other cards, and resumes them all once no card of the gang is busy any more.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import uuid
from collections import defaultdict
from typing import Any

from nats.aio.client import Client
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import SuspendCommand, SuspendReply
from qshare.contracts.claims import GPU_UUID_PATTERN
from qshare.contracts.errors import NotFound, QshareError
from qshare.contracts.preemption import ClaimAction, ClaimActionReply, ClaimRef
from qshare.contracts.tracing import inject_headers
from qshare.db import in_transaction, read_once
from qshare_preemptor import metrics
from qshare_preemptor.gangs import (
    Member,
    card_owner,
    existing_nodes,
    gang_of_card,
    known_cards,
    vgpus_of_claim,
)
from qshare_preemptor.lanes import Lanes
from qshare_preemptor.records import (
    close_records,
    close_released,
    hold_records,
    leave_records,
    open_claims,
    open_gangs,
    open_records,
    release_records,
    renew_nodes,
)
from qshare_preemptor.trusted import Trusted

log = logging.getLogger(__name__)
OWNER_TRUSTED_S = 2.0
"""How long a card's node, once read, is trusted without reading it again: a card removed
from a node and registered on another is the other's, for its events, this soon."""


class PreemptionService:
    def __init__(self, nc: Client, engine: AsyncEngine, source: str, timeout_s: float) -> None:
        self._nc = nc
        self._engine = engine
        self._source = source
        self._timeout_s = timeout_s
        self._held_by: dict[uuid.UUID, set[str]] = defaultdict(set)
        """The busy cards holding each suspended claim (it resumes once none is left)."""
        self._members: dict[uuid.UUID, set[Member]] = {}
        """The vGPUs of each suspended claim to resume once it is released."""
        self._stopped: set[Member] = set()
        """vGPUs suspended for a gang: a busy card suspends those of its gangs on other cards
        that are not among them yet (one on the card that went busy first is suspended when a
        second card of its gang goes busy: the first may go idle before the second)."""
        self._lock = asyncio.Lock()
        """Held while deciding (the maps above, the records), never across a node's answer:
        commands are queued in `_nodes` under it and awaited after it."""
        self._owners: Trusted[str, str] = Trusted(OWNER_TRUSTED_S)
        """Each card's node as last read."""
        self._unresumed: dict[str, set[int]] = defaultdict(set)
        """vGPUs by node whose resume did not reach the node (sent again until it does)."""
        self._owing: dict[uuid.UUID, set[Member]] = {}
        """Released claims whose gang record stays open (no busy card) until every resume
        reached its node: a restarted preemptor resumes them from that record."""
        self._nodes = Lanes()
        """Commands by node: decided under the lock, sent after it in that order (a node
        that does not answer holds back its own commands only, not the lock)."""
        self._claims = Lanes()
        """Claims' `suspended`/`resumed` events, published in the order they were decided."""
        self._cards = Lanes()
        """Card events by card, handled in the order they arrived."""
        self.card_events = 0
        """Busy and idle events handled so far (whatever they led to)."""

    # Read by the metrics server's thread while the event loop changes the maps: each is
    # copied in one step (list() of a dict view holds the GIL throughout), then counted.
    @property
    def claims_held(self) -> int:
        """Claims suspended for their gang while a card of it is busy."""
        return len(self.held_claims())

    def held_claims(self) -> set[uuid.UUID]:
        """The claims suspended for their gang while a card of it is busy."""
        return {claim for claim, cards in list(self._held_by.items()) if cards}

    @property
    def resumes_owed(self) -> dict[str, int]:
        """vGPUs whose resume did not reach their node yet, by node."""
        return {node: len(ids) for node, ids in list(self._unresumed.items()) if ids}

    async def reconcile(self) -> None:
        """At start: take up the gangs a previous preemptor left suspended. Each stays held
        by the busy cards its record names, as if their busy events had just been handled;
        the state every agent announces when the preemptor starts then resumes it once those
        cards are idle (and a card busy meanwhile adds itself). A gang whose record names no
        card still in the inventory is released now: no event would ever come for it. An
        operator's claim is taken up too (its gang record ends when its cards are idle; its
        vGPUs stay suspended until the operator resumes them)."""
        async with self._lock:
            left = await in_transaction(self._engine, open_gangs)
            free: list[uuid.UUID] = []
            for claim_id, (cards, members) in left.items():
                stopped = [m for m in members if cards - {m.gpu}]
                self._members.setdefault(claim_id, set()).update(members)
                if not stopped:
                    free.append(claim_id)
                    continue
                self._held_by[claim_id].update(cards)
                self._stopped.update(stopped)
            touched = [m for c in free for m in self._members.get(c, ())]
            sending = await self._release(free, "preemptor restarted") if free else []
        await asyncio.gather(*sending, self._renew(touched))

    async def resume_again(self) -> None:
        """Send again the resumes that did not reach their node (an agent restarting, NATS
        away), for nodes still in the inventory; a vGPU suspended since is left alone."""
        async with self._lock:
            pending = {node: sorted(ids) for node, ids in self._unresumed.items() if ids}
            if not pending:
                return
            known = await read_once(self._engine, lambda c: existing_nodes(c, list(pending)))
            for gone in set(pending) - known:
                self._unresumed.pop(gone, None)
            again = [self._send(n, pending[n], False, "resume sent again") for n in known]
        await asyncio.gather(*again)  # queued under the lock: a later suspension comes after
        await self._settle(list(self._owing))

    async def release_gone_cards(self) -> None:
        """Handle as idle each busy card holding a gang that left the inventory (its node or
        the card removed, say after the node went down while the card was busy): no idle
        event would ever come for it, and its gangs would stay suspended until a restart."""
        holding = {card for cards in list(self._held_by.values()) for card in cards}
        if not holding:
            return
        known = await read_once(self._engine, lambda c: known_cards(c, holding))
        for gpu in sorted(holding - known):
            log.info("card %s holding gangs left the inventory: handled as idle", gpu)
            await self._cards.queue(gpu, functools.partial(self.card_idle, gpu))

    async def card_event(self, node: str, gpu: str, busy: bool) -> None:
        """A busy or idle event published under `node`'s name about `gpu`, handled after the
        card's earlier events: each may read the card's node first, and a later event's read
        finishing first would otherwise have an idle handled before its busy, leaving the
        gang suspended on an idle card."""
        await self._cards.queue(gpu, lambda: self._card_event(node, gpu, busy))

    async def _card_event(self, node: str, gpu: str, busy: bool) -> None:
        kind = "busy" if busy else "idle"
        try:
            if not _is_card_uuid(gpu) or not await self._card_of(node, gpu):
                metrics.CARD_EVENTS.labels(kind, "refused").inc()
                return
            await (self.card_busy(gpu) if busy else self.card_idle(gpu))
            metrics.CARD_EVENTS.labels(kind, "handled").inc()
        finally:
            self.card_events += 1

    async def _card_of(self, node: str, gpu: str) -> bool:
        """Whether `gpu` is `node`'s card: a node may publish events under its own name only,
        so one about another node's card is refused (it would suspend or resume gangs there)."""
        known = self._owners.get(gpu)
        if known != node:
            known = await read_once(self._engine, lambda c: card_owner(c, gpu))
            self._owners.keep(gpu, known)
        if known == node:
            return True
        if known is None:  # an agent publishes its cards' state before its registration is in
            log.info("event of node %s about card %s, not registered (yet): ignored", node, gpu)
        else:
            log.warning("event of node %s about card %s, a card of %s: ignored", node, gpu, known)
        return False

    async def card_busy(self, gpu: str) -> None:
        """Suspend, on their other cards, the low-priority gangs holding a vGPU on `gpu`."""
        async with self._lock:
            members = await read_once(self._engine, lambda c: gang_of_card(c, gpu))
            others = [m for m in members if m.gpu != gpu]
            fresh = sorted({m.claim_id for m in others if not self._held_by.get(m.claim_id)})
            joined = {m.claim_id: m for m in others if gpu not in self._held_by[m.claim_id]}
            stop = [m for m in others if m not in self._stopped]
            for member in others:
                self._held_by[member.claim_id].add(gpu)
                self._members.setdefault(member.claim_id, set()).add(member)
            self._stopped.update(stop)
            if not (joined or stop):
                return
            sending = await self._hold(gpu, stop, list(joined.values()), fresh)
        await asyncio.gather(*sending, self._renew(members))

    async def _hold(
        self, gpu: str, stop: list[Member], joined: list[Member], fresh: list[uuid.UUID]
    ) -> list[asyncio.Task[Any]]:
        """Queue the suspension of `stop` and, once the nodes confirmed, the `fresh` claims'
        event; write meanwhile the records of the claims of `joined` naming `gpu` (awaited
        here, under the lock, so that a later idle ends them after). Returns what was
        queued, for the caller to await once it lets the lock go."""
        reason = f"high priority busy on {gpu}"[:253]
        record = asyncio.create_task(
            in_transaction(self._engine, lambda c: hold_records(c, joined, reason, gpu))
        )
        try:
            sent = self._queue_act(stop, suspend=True, reason=reason)
            return [*sent, *self._announce(fresh, "suspended", after=sent)]
        finally:
            await record

    async def card_idle(self, gpu: str) -> None:
        """Resume the gangs whose last busy card was `gpu` (not those an operator holds); the
        others it held stay held by their other busy cards."""
        async with self._lock:
            released = [c for c, cards in self._held_by.items() if gpu in cards]
            for claim_id in released:
                self._held_by[claim_id].discard(gpu)
            done = [c for c in released if not self._held_by[c]]
            kept = [c for c in released if self._held_by[c]]
            if kept:
                await in_transaction(self._engine, lambda c: leave_records(c, kept, gpu))
            touched = [m for c in released for m in self._members.get(c, ())]
            sending = await self._release(done, f"{gpu} idle") if done else []
        await asyncio.gather(*sending, self._renew(touched))

    async def _release(self, done: list[uuid.UUID], reason: str) -> list[asyncio.Task[Any]]:
        """Let the gangs `done` go: resume their vGPUs, but those of a claim an operator
        holds, which stays suspended (and gets no `resumed` event: before, it did)."""
        held = await in_transaction(self._engine, lambda c: open_claims(c, done, "operator"))
        running = [c for c in done if c not in held]
        resume = [m for c in running for m in self._members.get(c, set())]
        for claim_id in done:
            self._held_by.pop(claim_id, None)
            self._stopped.difference_update(self._members.pop(claim_id, set()))
        return await self._free(done, resume, running, reason)

    async def _free(
        self, done: list[uuid.UUID], resume: list[Member], running: list[uuid.UUID], reason: str
    ) -> list[asyncio.Task[Any]]:
        """Queue the resumes of `resume`, end the gang records of `done` (under the lock,
        in the order decided) and queue the `resumed` events of the claims `running` after
        the resumes; returns what was queued."""
        owing = {c: {m for m in resume if m.claim_id == c} for c in running}
        owing = {c: members for c, members in owing.items() if members}
        self._owing.update(owing)
        ended = [c for c in done if c not in owing]
        sent = self._queue_act(resume, suspend=False, reason=reason)
        await in_transaction(self._engine, lambda c: _release_records(c, ended, list(owing)))
        settled = asyncio.create_task(self._settle(list(owing), after=sent))
        return [*sent, settled, *self._announce(running, "resumed", after=sent)]

    async def _settle(
        self, claim_ids: list[uuid.UUID], after: list[asyncio.Task[SuspendReply]] | None = None
    ) -> None:
        """Once the commands `after` ended, end the released gang records of those of
        `claim_ids` whose resumes all reached their nodes (the others wait for a resend)."""
        if after:
            await asyncio.wait(after)
        owing = {c: self._owing[c] for c in claim_ids if c in self._owing}
        done = [c for c, members in owing.items() if not any(self._owed(m) for m in members)]
        for claim_id in done:
            if self._owing.get(claim_id) is owing[claim_id]:  # not released again since
                del self._owing[claim_id]
        if done:
            await in_transaction(self._engine, lambda c: close_released(c, done))

    def _owed(self, member: Member) -> bool:
        return member.local_id in self._unresumed.get(member.node, ())

    async def operator(self, action: ClaimAction, suspend: bool) -> ClaimActionReply:
        members = await in_transaction(self._engine, lambda c: self._owned(c, action))
        if suspend:
            done, missing = await self._suspend(members, action.reason, action.actor)
        else:
            done, missing = await self._resume(action.claim_id, members, action)
        await self._renew(members)
        return ClaimActionReply(
            claim_id=action.claim_id, suspended=suspend, vgpus=done, missing=missing
        )

    async def _resume(
        self, claim_id: uuid.UUID, members: list[Member], action: ClaimAction
    ) -> tuple[int, int]:
        """End the operator's hold of a claim: resume its vGPUs but those its gang holds
        suspended for a busy card (they resume with the gang, whose release announces
        `resumed`). Before, all of them ran again while the card high priority needed was
        still busy."""
        async with self._lock:
            gang = self._held_by.get(claim_id, set())
            free = [m for m in members if not (gang and m in self._stopped)]
            sent = self._queue_act(free, suspend=False, reason=action.reason)
            self._stopped.difference_update(free)  # running again: a busy card stops them
            await in_transaction(
                self._engine, lambda c: close_records(c, [claim_id], "operator", action.actor)
            )
            announced = [] if gang else self._announce([claim_id], "resumed", after=sent)
        replies = await asyncio.gather(*sent)
        await asyncio.gather(*announced)
        return _counts(replies)

    async def _renew(self, members: list[Member]) -> None:
        """Have the allocator send the nodes of `members` their desired state again (after a
        change of their claims' records): a failure is logged, the commands already sent
        stand."""
        names = {m.node for m in members}
        if not names:
            return
        try:
            await in_transaction(self._engine, lambda c: renew_nodes(c, names))
        except Exception:
            log.exception("nodes %s not renewed: an apply reaches them with the next change",
                          sorted(names))  # fmt: skip

    async def _owned(self, conn: AsyncConnection, action: ClaimAction) -> list[Member]:
        members = await vgpus_of_claim(conn, action.claim_id)
        if not members or (action.tenant is not None and members[0].tenant != action.tenant):
            raise NotFound(f"claim {action.claim_id} not found, or it holds no vGPU now")
        return members

    def _queue_act(
        self, members: list[Member], suspend: bool, reason: str
    ) -> list[asyncio.Task[SuspendReply]]:
        """Queue one command per node for `members`; never waits (callers hold the lock)."""
        by_node: dict[str, list[int]] = defaultdict(list)
        for member in members:
            by_node[member.node].append(member.local_id)
        if suspend:  # decided now: a resume owed before must not be sent after it
            for node, ids in by_node.items():
                self._unresumed[node].difference_update(ids)
        return [self._send(node, ids, suspend, reason) for node, ids in by_node.items()]

    def _send(
        self, node: str, ids: list[int], suspend: bool, reason: str
    ) -> asyncio.Task[SuspendReply]:
        """`_command` once the commands decided before for `node` have been answered (or
        timed out): a node gets its suspends and resumes in the order they were decided."""
        return self._nodes.queue(node, functools.partial(self._command, node, ids, suspend, reason))

    async def _command(self, node: str, ids: list[int], suspend: bool, reason: str) -> SuspendReply:
        verb = "suspend" if suspend else "resume"
        command = SuspendCommand(local_ids=ids, reason=reason[:253])
        if suspend:
            self._unresumed[node].difference_update(ids)  # this command decides now
        try:
            with metrics.COMMAND_SECONDS.labels(verb).time():
                reply = await rpc.call(self._nc, subjects.node_command(node, verb), self._source,
                                       command, SuspendReply, timeout=self._timeout_s)  # fmt: skip
        except QshareError as error:
            log.warning("node %s did not %s %s: %s", node, verb, ids, error.detail)
            metrics.COMMANDS.labels(verb, "failed").inc()
            if not suspend:
                self._unresumed[node].update(ids)
            return SuspendReply(done=[], missing=ids)
        metrics.COMMANDS.labels(verb, "ok").inc()
        if not suspend:
            self._unresumed[node].difference_update(ids)  # owed no more
        return reply

    async def _suspend(
        self, members: list[Member], reason: str, actor: str | None
    ) -> tuple[int, int]:
        """Suspend `members` for an operator (`actor`) while the record is written; announce
        it as soon as the nodes confirmed (what the event states), then finish the record."""
        record = asyncio.create_task(
            in_transaction(
                self._engine, lambda c: open_records(c, members, "operator", reason[:253], actor)
            )
        )
        try:
            sent = self._queue_act(members, suspend=True, reason=reason)
            announced = self._announce(sorted({m.claim_id for m in members}), "suspended", sent)
            replies = await asyncio.gather(*sent)
            await asyncio.gather(*announced)
        finally:
            await record
        return _counts(replies)

    def _announce(
        self, claim_ids: list[uuid.UUID], kind: str, after: list[asyncio.Task[SuspendReply]]
    ) -> list[asyncio.Task[None]]:
        """Queue each claim's event of `kind`, published once the commands `after` ended,
        after the events decided before for that claim."""

        async def publish(claim_id: uuid.UUID) -> None:
            if after:
                await asyncio.wait(after)
            await self._publish_claims([claim_id], kind)

        return [self._claims.queue(c, functools.partial(publish, c)) for c in claim_ids]

    async def _publish_claims(self, claim_ids: list[uuid.UUID], kind: str) -> None:
        for claim_id in claim_ids:
            body = envelope.wrap(
                self._source, f"io.qshare.claim.{kind}", ClaimRef(claim_id=claim_id)
            )
            await self._nc.publish(subjects.claim_event(str(claim_id), kind),
                                   envelope.encode(body), headers=inject_headers())  # fmt: skip


async def _release_records(
    conn: AsyncConnection, ended: list[uuid.UUID], owing: list[uuid.UUID]
) -> None:
    await close_records(conn, ended, "gang")
    await release_records(conn, owing)


def _counts(replies: list[SuspendReply]) -> tuple[int, int]:
    """vGPUs the nodes acted on, and those they did not have or did not answer for."""
    return sum(len(r.done) for r in replies), sum(len(r.missing) for r in replies)


def _is_card_uuid(gpu: str) -> bool:
    """Whether an event subject's card token can be a card at all: its node published the
    token, so it may hold anything, a NUL (which Postgres text cannot hold) included."""
    if re.fullmatch(GPU_UUID_PATTERN, gpu):
        return True
    log.warning("card event about %r, which is no card UUID: ignored", gpu[:64])
    return False
