"""The starvation watch: a low-priority claim that, over a whole window, received less than
its class's `starvation_share` of its card while high priority left the card less than that
share to harvest, is starved. It is recorded (`GET /v1/starvation`), announced once
(`qshare.evt.claim.<id>.starved`) and, if its class allows (`move_on_starvation`) and it
holds one card, the allocator is asked to move it to a card with more harvestable time (at
most once per window). The record closes when a whole window shows it fed again, or when it
leaves the card (moved or released).

Usage reports come from node agents on `qshare.node.<node>.usage`; a malformed one, one whose
body names another node than its subject, or one naming a card of another node is refused
(logged and counted), and nothing of it is used."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid

from nats.aio.client import Client
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.errors import QshareError
from qshare.contracts.usage import MoveClaim, MoveReply, NodeUsage, Starved
from qshare.db import in_transaction
from qshare_preemptor import metrics, starved
from qshare_preemptor.starved import Key, Watched
from qshare_preemptor.trusted import Trusted
from qshare_preemptor.windows import CardWindow

log = logging.getLogger(__name__)
MAX_TARGETS = 64
CLASSES_REFRESH_S = 10.0
"""A class added with a `starvation_share` is watched from at most this long after."""
CARDS_TRUSTED_S = 2.0
"""How long a node's cards, once read, are trusted without reading them again: a card
removed from a node and registered on another is the other's, for usage reports, this soon."""


class Refused(Exception):
    """A usage report that is not used; the message says why."""


class StarvationWatch:
    def __init__(
        self, nc: Client, engine: AsyncEngine, source: str, window_s: float, timeout_s: float
    ) -> None:
        self._nc = nc
        self._engine = engine
        self._source = source
        self.window_s = window_s
        self._timeout_s = timeout_s
        self.cards: dict[str, CardWindow] = {}
        self._node_cards: Trusted[str, set[str]] = Trusted(CARDS_TRUSTED_S)
        """Each node's cards as last read."""
        self._tried: dict[uuid.UUID, float] = {}
        self._lock = asyncio.Lock()
        self._watching = False
        self._classes_read_at = -math.inf
        self.taken = 0
        self.refused = 0
        self.reported = 0
        self.moved = 0

    async def usage(self, subject: str, raw: bytes) -> None:
        """Take one node's report; a refused one is logged and counted."""
        try:
            report = _decode(subject, raw)
            async with self._lock:
                await self._take(report)
        except Refused as why:
            self.refused += 1
            log.warning("usage report on %s refused: %s", subject, why)
        except Exception as error:  # Postgres or NATS away: one line, the next report retries
            log.warning("usage report on %s not judged: %s: %s", subject,
                        type(error).__name__, error)  # fmt: skip

    async def _take(self, report: NodeUsage) -> None:
        await self._check_cards(report)
        now = time.monotonic()
        for card in report.cards:
            window = self.cards.setdefault(card.gpu, CardWindow())
            window.add(now, report.interval_ns, card, self.window_s)
        self.taken += 1
        if await self._any_watched(now):
            await self._judge(report.node, now)

    async def _any_watched(self, now: float) -> bool:
        """Whether some class is watched (re-read every `CLASSES_REFRESH_S` at most): a
        cluster that watches nothing pays no query per report."""
        if now - self._classes_read_at >= min(self.window_s, CLASSES_REFRESH_S):
            self._watching = await in_transaction(self._engine, starved.any_watched_class)
            self._classes_read_at = now
        return self._watching

    async def _check_cards(self, report: NodeUsage) -> None:
        """Every card named must be the node's (inventory read again on an unknown card, and
        once what was read is older than CARDS_TRUSTED_S)."""
        named = {c.gpu for c in report.cards}
        own = self._node_cards.get(report.node)
        if own is None or not named <= own:
            own = await in_transaction(self._engine, lambda c: starved.node_cards(c, report.node))
            self._node_cards.keep(report.node, own)
        foreign = sorted(named - own)
        if foreign:
            raise Refused(f"cards {foreign[:3]} are not cards of node {report.node}")

    async def _judge(self, node: str, now: float) -> None:
        async def read(conn: AsyncConnection) -> tuple[list[Watched], dict[Key, int]]:
            return await starved.watched(conn, node), await starved.open_on(conn, node)

        claims, records = await in_transaction(self._engine, read)
        for claim in claims:
            await self._judge_claim(claim, records, now)
        present = {(c.claim_id, c.gpu) for c in claims}
        gone = [record for key, record in records.items() if key not in present]
        if gone:
            await in_transaction(self._engine, lambda c: starved.close(c, gone))

    async def _judge_claim(self, claim: Watched, records: dict[Key, int], now: float) -> None:
        window = self.cards.get(claim.gpu)
        share = window.share(claim.local_id) if window else None
        if window is None or share is None or not window.whole(self.window_s, now):
            return
        hungry = share < claim.threshold and window.harvestable < claim.threshold
        known = records.get((claim.claim_id, claim.gpu))
        if not hungry:
            if known is not None:
                await in_transaction(self._engine, lambda c: starved.close(c, [known]))
            return
        record = (
            known if known is not None else await self._report(claim, share, window.harvestable)
        )
        if claim.movable and claim.cards == 1:
            await self._maybe_move(claim, record, window.harvestable, now)

    async def _report(self, claim: Watched, share: float, harvestable: float) -> int:
        record = await in_transaction(
            self._engine,
            lambda c: starved.open_record(c, claim, share, harvestable, self.window_s),
        )
        body = Starved(
            claim_id=claim.claim_id,
            gpu=claim.gpu,
            node=claim.node,
            share=share,
            harvestable_share=harvestable,
            window_s=self.window_s,
        )
        wrapped = envelope.wrap(self._source, "io.qshare.claim.starved", body)
        subject = subjects.claim_event(str(claim.claim_id), "starved")
        await self._nc.publish(subject, envelope.encode(wrapped))
        self.reported += 1
        metrics.STARVED.inc()
        log.info(
            "claim %s starved on %s: share %.3f, harvestable %.3f",
            claim.claim_id,
            claim.gpu,
            share,
            harvestable,
        )
        return record

    async def _maybe_move(
        self, claim: Watched, record: int, harvestable: float, now: float
    ) -> None:
        """Ask the allocator to move the claim to a better card, at most once per window."""
        if now - self._tried.get(claim.claim_id, -self.window_s) < self.window_s:
            return
        self._tried = {c: t for c, t in self._tried.items() if now - t < self.window_s}
        self._tried[claim.claim_id] = now
        targets = self.better_cards(claim.gpu, claim.threshold, harvestable, now)
        if not targets:
            await self._note(record, "not moved: no card with more harvestable time")
            return
        command = MoveClaim(claim_id=claim.claim_id, from_gpu=claim.gpu, to_gpus=targets)
        try:
            reply = await rpc.call(
                self._nc,
                subjects.CLAIMS_MOVE,
                self._source,
                command,
                MoveReply,
                timeout=self._timeout_s,
            )
        except QshareError as error:
            await self._note(record, f"not moved: {error.detail}")
            return
        if reply.moved_to is None:
            await self._note(record, f"not moved: {reply.reason}")
            return
        self.moved += 1
        moved_to = reply.moved_to
        await in_transaction(self._engine, lambda c: starved.close(c, [record], moved_to))

    def better_cards(self, gpu: str, threshold: float, harvestable: float, now: float) -> list[str]:
        """Cards with a whole recent window that leave at least `threshold` to harvest and
        more than `harvestable`, most harvestable first."""
        better = [
            (w.harvestable, uuid)
            for uuid, w in self.cards.items()
            if uuid != gpu
            and w.whole(self.window_s, now)
            and w.harvestable >= threshold
            and w.harvestable > harvestable
        ]
        return [uuid for _, uuid in sorted(better, reverse=True)[:MAX_TARGETS]]

    async def _note(self, record: int, text: str) -> None:
        await in_transaction(self._engine, lambda c: starved.note(c, record, text))


def _decode(subject: str, raw: bytes) -> NodeUsage:
    node = subjects.node_of(subject)
    try:
        report = envelope.decode(raw).payload(NodeUsage)
    except ValidationError as exc:
        fields = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]]
        raise Refused("malformed: " + "; ".join(fields)) from exc
    if report.node != node:
        raise Refused(f"the body names node {report.node!r}, the subject node {node!r}")
    return report
