"""The preemptor process: subscribes to card busy/idle events and to operator requests, and
acts through the node agents. One instance acts on events; requests may reach any. When it
starts and whenever it reconnects to NATS it asks every agent for its cards' present state
(`qshare.nodes.announce`), so what it missed meanwhile converges."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from qshare import bus, health
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import AnnounceRequest
from qshare.contracts.errors import InvalidInput, QshareError
from qshare.contracts.preemption import ClaimAction
from qshare.contracts.tracing import flush_tracing, handling, setup_tracing
from qshare.metrics_http import MetricsServer, serve_metrics
from qshare.natsauth import ServiceRole
from qshare.service import Service, cancelled
from qshare_preemptor import metrics
from qshare_preemptor.service import PreemptionService
from qshare_preemptor.settings import PreemptorSettings
from qshare_preemptor.starvation import StarvationWatch

log = logging.getLogger(__name__)
SCOPE = "qshare.preemptor"
RESUME_AGAIN_S = 1.0
"""How often resumes that did not reach their node are sent again, and the busy cards
holding gangs are looked up in the inventory (those gone are handled as idle)."""
SCHEMA_AGAIN_S = 1.0
"""How often a preemptor waiting for the schema looks again."""
MAX_IN_FLIGHT = 32
"""Messages of one kind (card events, usage reports, requests) handled at once; the rest wait
in the subscription's bounded queue (NATS drops beyond it and says so), not as tasks."""


class Preemptor(Service):
    def __init__(self, settings: PreemptorSettings) -> None:
        self.settings = settings
        self.source = f"qshare-preemptor/{settings.instance}"
        self._engine: AsyncEngine | None = None
        self._nc: Client | None = None
        self.service: PreemptionService | None = None
        self.starvation: StarvationWatch | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._retrier: asyncio.Task[None] | None = None
        self._slots = {kind: asyncio.Semaphore(MAX_IN_FLIGHT) for kind in _KINDS}
        self.announce_requests = 0
        """Times this preemptor asked the nodes to announce their cards' state."""
        self._health: health.HealthServer | None = None
        self._metrics: MetricsServer | None = None
        self.probes = health.Probes()
        self.probes.live["nats"] = health.nats_not_closed(lambda: self._nc)
        self.probes.live["tasks"] = health.tasks_running(
            lambda: [self._retrier] if self._retrier else []
        )
        self.probes.ready["nats"] = health.nats_connected(lambda: self._nc)
        self.probes.ready["database"] = health.database_ready(lambda: self._engine)

    async def start(self) -> None:
        s = self.settings
        self._health = await health.serve(self.probes, s)
        self._metrics = serve_metrics(s, metrics.StateCollector(self._held, self._owed))
        setup_tracing("qshare-preemptor")
        self._engine = create_async_engine(s.database_url, pool_size=s.pool_size)
        options = s.bus_as(self.source, ServiceRole.PREEMPTOR)
        self._nc = await bus.connect(options, reconnected=self._reconnected)
        await self._schema_migrated()  # before any subscription: nothing handled on no tables
        self.service = PreemptionService(self._nc, self._engine, self.source, s.command_timeout_s)
        await self._nc.subscribe("qshare.evt.gpu.*.*.busy", cb=self._on_card)
        await self._nc.subscribe("qshare.evt.gpu.*.*.idle", cb=self._on_card)
        for subject in (subjects.CLAIMS_SUSPEND, subjects.CLAIMS_RESUME):
            await self._nc.subscribe(subject, queue=subjects.PREEMPTOR_QUEUE, cb=self._on_request)
        self.starvation = StarvationWatch(self._nc, self._engine, self.source,
                                          s.starvation_window_s, s.command_timeout_s)  # fmt: skip
        await self._nc.subscribe(subjects.NODE_USAGES, cb=self._on_usage)
        await bus.settled(self._nc)
        await self.service.reconcile()
        await self.ask_announce("preemptor started")
        self._retrier = asyncio.create_task(self._resume_again(self.service), name="resumer")
        self.probes.serving()
        log.info("preemptor %s serving", s.instance)

    async def stop(self) -> None:
        self.probes.stopping()
        if self._health is not None:
            await self._health.stop()
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.stop)
        if self._retrier is not None:
            await cancelled(self._retrier)
        if self._nc is not None:
            await bus.close(self._nc)
        for task in list(self._tasks):
            task.cancel()
        if self._engine is not None:
            await self._engine.dispose()
        await asyncio.to_thread(flush_tracing)

    def _held(self) -> int:
        return self.service.claims_held if self.service is not None else 0

    def _owed(self) -> dict[str, int]:
        return self.service.resumes_owed if self.service is not None else {}

    async def _schema_migrated(self) -> None:
        """Wait for the allocator to create the schema (a first apply starts every pod at
        once): live meanwhile, not ready, rather than exiting and restarting until it is.
        Nothing is subscribed yet, so no event or request is handled against missing tables;
        the card states missed meanwhile come with the nodes' announce once it starts.
        Postgres out of reach ends the start, as at any other step."""
        assert self._engine is not None
        if await health.schema_revision(self._engine) is not None:
            return
        log.warning("preemptor %s: the database schema is not migrated yet; waiting for it "
                    "(python -m qshare_allocator migrate)", self.settings.instance)  # fmt: skip
        await health.until_migrated(self._engine, SCHEMA_AGAIN_S)

    async def _reconnected(self) -> None:
        await self.ask_announce("preemptor reconnected to NATS")

    async def ask_announce(self, reason: str) -> None:
        """Ask every node agent to publish its cards' present busy/idle state again: card
        events published while this preemptor was not subscribed (starting, restarting,
        disconnected from NATS) are lost, and the states make good what they missed (a gang
        whose card went idle meanwhile resumes; one whose card is busy is suspended)."""
        assert self._nc is not None
        body = envelope.wrap(
            self.source, "io.qshare.nodes.announce", AnnounceRequest(reason=reason)
        )
        await self._nc.publish(subjects.NODES_ANNOUNCE, envelope.encode(body))
        self.announce_requests += 1
        log.info("preemptor %s asked the nodes for their cards' state (%s)",
                 self.settings.instance, reason)  # fmt: skip

    async def _resume_again(self, service: PreemptionService) -> None:
        while True:
            await asyncio.sleep(RESUME_AGAIN_S)
            try:
                await service.resume_again()
                await service.release_gone_cards()
            except Exception:
                log.exception("sending resumes again or releasing the gangs of cards gone "
                              "failed; next try in %.0f s", RESUME_AGAIN_S)  # fmt: skip

    @property
    def in_flight(self) -> int:
        """Messages being handled now."""
        return len(self._tasks)

    async def _spawn(self, kind: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work()` once fewer than MAX_IN_FLIGHT messages of `kind` are in hand."""
        slots = self._slots[kind]
        await slots.acquire()
        task = asyncio.create_task(work())
        self._tasks.add(task)
        task.add_done_callback(lambda _: slots.release())
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("preemptor task failed", exc_info=task.exception())

    async def _on_card(self, msg: Msg) -> None:
        assert self.service is not None
        node, gpu, kind = subjects.parse_gpu_event(msg.subject)
        service = self.service
        with handling(SCOPE, msg.subject, msg.headers, SpanKind.CONSUMER):
            # the task copies the span's context: its commands to the nodes are its children
            await self._spawn("card", lambda: service.card_event(node, gpu, busy=kind == "busy"))

    async def _on_usage(self, msg: Msg) -> None:
        assert self.starvation is not None
        starvation = self.starvation
        await self._spawn("usage", lambda: starvation.usage(msg.subject, msg.data))

    async def _on_request(self, msg: Msg) -> None:
        await self._spawn("request", lambda: self._answer(msg))

    async def _answer(self, msg: Msg) -> None:
        with handling(SCOPE, msg.subject, msg.headers):
            await self._answer_traced(msg)

    async def _answer_traced(self, msg: Msg) -> None:
        assert self._nc is not None and self.service is not None
        try:
            action = _decode(msg)
            suspend = msg.subject == subjects.CLAIMS_SUSPEND
            reply = await self.service.operator(action, suspend)
        except QshareError as error:
            await rpc.reply_error(self._nc, msg, error)
            return
        except Exception:
            log.exception("preemptor request on %s failed", msg.subject)
            await rpc.reply_error(self._nc, msg, QshareError("internal error; see preemptor logs"))
            return
        await rpc.reply_ok(self._nc, msg, self.source, reply)


_KINDS = ("card", "usage", "request")


def _decode(msg: Msg) -> ClaimAction:
    try:
        return envelope.decode(msg.data).payload(ClaimAction)
    except ValidationError as exc:
        raise InvalidInput("malformed request: " + str(exc.errors()[:3])) from exc
