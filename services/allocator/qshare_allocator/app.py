"""The allocator process: wires Postgres, NATS, the routes, the outbox relay and the
pending-claim sweeper, and runs until stopped. Any number of replicas may run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare import bus, health
from qshare.contracts import envelope, subjects
from qshare.contracts.claims import (
    ClaimView,
    CreateClaim,
    CreateClaimReply,
    DeleteClaim,
    ResizeClaim,
)
from qshare.contracts.domain import Priority
from qshare.contracts.errors import InvalidInput, NotFound
from qshare.contracts.nodes import (
    ChangeNode,
    GpuView,
    Heartbeat,
    NodeRegistration,
    NodeView,
    RemoveCard,
    RemoveNode,
    is_node_name,
)
from qshare.contracts.placement import PreviewPlacement
from qshare.contracts.sharing import ChangeSharing
from qshare.contracts.streams import ensure_events_stream
from qshare.contracts.tracing import attached, flush_tracing, setup_tracing
from qshare.contracts.usage import MoveClaim, MoveReply
from qshare.metrics_http import MetricsServer, serve_metrics
from qshare.service import Service, cancelled
from qshare_allocator import metrics
from qshare_allocator.claims.resize import Resizer
from qshare_allocator.claims.service import ClaimService, PendingCursor, PendingTry, Placement
from qshare_allocator.db import in_transaction, make_engine
from qshare_allocator.inventory.service import InventoryService
from qshare_allocator.inventory.sharing import ask_sharing
from qshare_allocator.messaging import Grouping, Route, Router
from qshare_allocator.migrate import head, upgrade
from qshare_allocator.nodes.dispatch import Dispatcher
from qshare_allocator.nodes.reregister import Reregistration
from qshare_allocator.outbox import OutboxRelay
from qshare_allocator.placement.finder import Choice
from qshare_allocator.placement.moving import Mover
from qshare_allocator.placement.preview import PreviewService
from qshare_allocator.settings import AllocatorSettings

log = logging.getLogger(__name__)
STOP_DRAIN_S = 10.0
"""How long a stopping replica waits for the messages in hand."""


class Allocator(Service):
    """One replica. Use `async with Allocator(settings):` or `await Allocator(settings).run()`."""

    def __init__(self, settings: AllocatorSettings) -> None:
        self.settings = settings
        self.source = f"qshare-allocator/{settings.instance}"
        self.claims = ClaimService(settings.cluster, self.source, self._placed_on)
        self.resizer = Resizer(settings.cluster, self.source)
        self.inventory = InventoryService(settings.cluster, self.source)
        self.previews = PreviewService(settings.cluster)
        self.mover = Mover(settings.cluster, self.source)
        self._engine: AsyncEngine | None = None
        self._nc: Client | None = None
        self._router: Router | None = None
        self._relay: OutboxRelay | None = None
        self._dispatcher: Dispatcher | None = None
        self._reregistration: Reregistration | None = None
        self._sweep_wanted = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._health: health.HealthServer | None = None
        self._metrics: MetricsServer | None = None
        self.probes = health.Probes()
        self.probes.live["nats"] = health.nats_not_closed(lambda: self._nc)
        self.probes.live["tasks"] = health.tasks_running(lambda: self._background)
        self.probes.ready["nats"] = health.nats_connected(lambda: self._nc)

    @property
    def engine(self) -> AsyncEngine:
        assert self._engine is not None, "allocator not started"
        return self._engine

    @property
    def served(self) -> int:
        """Messages this replica has handled."""
        return self._router.handled if self._router is not None else 0

    async def start(self) -> None:
        self._health = await health.serve(self.probes, self.settings)
        setup_tracing("qshare-allocator", self.settings.trace_console)
        if self.settings.migrate_on_start:
            await upgrade(self.settings.database_url)
        needed = await asyncio.to_thread(head, self.settings.database_url)
        self._engine = make_engine(self.settings.database_url, self.settings.pool_size)
        self.probes.ready["database"] = health.database_ready(lambda: self._engine, needed)
        self._nc = await bus.connect(self.settings.bus(self.source))
        js = self._nc.jetstream()
        await ensure_events_stream(js)
        self._relay = OutboxRelay(self._engine, js, self.settings.outbox_scan_s)
        self._dispatcher = Dispatcher(
            self._nc,
            self._engine,
            self.source,
            self.settings.cluster.node_timeout_s,
            self.settings.apply_timeout_s,
            self._relay.wake,
            self.claims.finish_evictions,
        )
        self._reregistration = Reregistration(self._nc, self.source, self.settings.register_again_s)
        self._router = Router(
            self._nc,
            self._engine,
            self.source,
            subjects.ALLOCATOR_QUEUE,
            self.settings.max_in_flight,
            Grouping(self.settings.create_group, self.settings.create_groups_open),
        )
        for route in self._routes():
            await self._router.subscribe(route)
        await bus.settled(self._nc)  # "serving" means the server routes requests here
        self._background = [
            asyncio.create_task(self._relay.run(), name="outbox relay"),
            asyncio.create_task(self._sweeper(), name="pending sweeper"),
            asyncio.create_task(self._dispatch_scanner(), name="dispatch scanner"),
        ]
        self._metrics = serve_metrics(self.settings)
        gc.freeze()  # what start-up made is never garbage: full collections skip it
        self.probes.serving()
        log.info("allocator %s serving", self.settings.instance)

    async def stop(self) -> None:
        self.probes.stopping()
        if self._health is not None:
            await self._health.stop()
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.stop)
            self._metrics = None
        if self._nc is not None:
            await bus.close(self._nc)
        if self._router is not None:
            with contextlib.suppress(TimeoutError):  # a handler stuck on a dead server
                await asyncio.wait_for(self._router.drain(), STOP_DRAIN_S)
        for task in self._background:
            await cancelled(task)
        if self._dispatcher is not None:
            await self._dispatcher.stop()
        if self._engine is not None:
            await self._engine.dispose()
        await asyncio.to_thread(flush_tracing)

    def _routes(self) -> list[Route]:
        return [
            Route(
                subjects.CLAIMS_CREATE, CreateClaim, self._create, self._after_write, grouped=True
            ),
            Route(subjects.CLAIMS_DELETE, DeleteClaim, self._delete, self._after_release),
            Route(subjects.CLAIMS_RESIZE, ResizeClaim, self._resize, self._after_release),
            Route(subjects.NODES_REGISTER, NodeRegistration, self._register, self._after_register),
            Route(
                subjects.NODE_REGISTRATIONS,
                NodeRegistration,
                self._register_own,
                self._after_register,
            ),
            Route(subjects.HEARTBEATS, Heartbeat, self._heartbeat, self._after_heartbeat),
            Route(subjects.NODES_DELETE, RemoveNode, self._remove_node, self._after_release),
            Route(subjects.NODES_UPDATE, ChangeNode, self._change_node, self._after_release),
            Route(subjects.GPUS_DELETE, RemoveCard, self._remove_card, self._after_release),
            Route(subjects.GPUS_SHARING, ChangeSharing, self._ask_sharing, self._after_sharing),
            Route(subjects.PLACEMENT_PREVIEW, PreviewPlacement, self._preview),
            Route(subjects.CLAIMS_MOVE, MoveClaim, self._move, self._after_move),
        ]

    async def _create(self, conn: AsyncConnection, command: CreateClaim, msg: Msg) -> BaseModel:
        reply: CreateClaimReply = await self.claims.create(conn, command)
        if reply.created:
            metrics.CLAIMS.labels(command.spec.priority.value, reply.claim.status.value).inc()
        return reply

    async def _delete(self, conn: AsyncConnection, command: DeleteClaim, msg: Msg) -> BaseModel:
        return await self.claims.delete(conn, command)

    async def _resize(self, conn: AsyncConnection, command: ResizeClaim, msg: Msg) -> BaseModel:
        return await self.resizer.resize(conn, command)

    async def _move(self, conn: AsyncConnection, command: MoveClaim, msg: Msg) -> BaseModel:
        return await self.mover.move(conn, command)

    def _after_move(self, result: Any) -> None:
        self._after_write(None)
        if isinstance(result, MoveReply) and result.moved_to is not None:
            for node in (result.from_node, result.to_node):
                if node is not None:
                    self.dispatcher.wanted(node)

    async def _preview(
        self, conn: AsyncConnection, request: PreviewPlacement, msg: Msg
    ) -> BaseModel:
        return await self.previews.preview(conn, request)

    async def _register(
        self, conn: AsyncConnection, registration: NodeRegistration, msg: Msg
    ) -> BaseModel:
        return await self.inventory.register(conn, registration)

    async def _change_node(self, conn: AsyncConnection, command: ChangeNode, msg: Msg) -> BaseModel:
        return await self.inventory.change_node(conn, command)

    async def _remove_node(self, conn: AsyncConnection, command: RemoveNode, msg: Msg) -> BaseModel:
        return await self.inventory.remove_node(conn, command.name)

    async def _remove_card(self, conn: AsyncConnection, command: RemoveCard, msg: Msg) -> BaseModel:
        return await self.inventory.remove_card(conn, command.node, command.uuid)

    async def _ask_sharing(
        self, conn: AsyncConnection, command: ChangeSharing, msg: Msg
    ) -> BaseModel:
        return await ask_sharing(conn, command)

    def _after_sharing(self, result: Any) -> None:
        if isinstance(result, GpuView):
            self.dispatcher.wanted(result.node)

    async def _register_own(
        self, conn: AsyncConnection, registration: NodeRegistration, msg: Msg
    ) -> BaseModel:
        """A node agent's registration on its own subject: the name must be the subject's."""
        subject_node = _subject_node(msg.subject)
        if registration.name != subject_node:
            raise InvalidInput.on(
                "name", f"a registration on {msg.subject} must name node {subject_node}"
            )
        return await self.inventory.register(conn, registration)

    async def _heartbeat(
        self, conn: AsyncConnection, beat: Heartbeat, msg: Msg
    ) -> BaseModel | None:
        node = _subject_node(msg.subject)
        sent = envelope.decode(msg.data).time  # decoded once already: it is valid
        try:
            freed = await self.inventory.heartbeat(conn, node, beat, sent)
        except NotFound:
            await self.reregistration.unknown_heartbeat(node)
            raise
        return _Freed(freed=freed)

    def _placed_on(self, choice: Choice) -> None:
        if self._dispatcher is not None:
            self._dispatcher.placed_on(choice.node, choice.agent)

    @property
    def reregistration(self) -> Reregistration:
        assert self._reregistration is not None, "allocator not started"
        return self._reregistration

    def _after_write(self, result: Any) -> None:
        assert self._relay is not None
        self._relay.wake()
        claim = result.claim if isinstance(result, CreateClaimReply) else result
        if isinstance(claim, ClaimView) and claim.node is not None:
            self.dispatcher.wanted(claim.node)

    def _after_register(self, result: Any) -> None:
        self._after_release(None)
        if isinstance(result, NodeView):
            self.dispatcher.registered(result.name)

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "allocator not started"
        return self._dispatcher

    async def _dispatch_scanner(self) -> None:
        """Re-send desired state to nodes that have not confirmed it, every `dispatch_scan_s`."""
        while True:
            await asyncio.sleep(self.settings.dispatch_scan_s)
            try:
                if await self.dispatcher.scan():
                    self._sweep_wanted.set()
            except Exception:
                log.exception("dispatch scan failed; will retry")

    def _after_release(self, result: Any) -> None:
        self._after_write(result)
        self._sweep_wanted.set()

    def _after_heartbeat(self, result: Any) -> None:
        if isinstance(result, _Freed) and result.freed:
            self._sweep_wanted.set()

    async def _sweeper(self) -> None:
        """Retry pending claims when capacity may have appeared, and every `pending_sweep_s`."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._sweep_wanted.wait(), timeout=self.settings.pending_sweep_s
                )
            self._sweep_wanted.clear()
            try:
                await self.sweep_pending()
            except Exception:
                log.exception("pending sweep failed; will retry")

    async def sweep_pending(self) -> None:
        """One pass over the pending claims, high priority first, oldest first, each in its
        own transaction."""
        for priority in (Priority.HIGH, Priority.LOW):
            cursor: PendingCursor | None = None
            while True:
                place = functools.partial(self._place_after, cursor, priority)
                tried = await in_transaction(self.engine, place)
                if tried is None:
                    break
                cursor = tried.cursor
                if tried.placed:  # counted once committed
                    metrics.PENDING_PLACED.inc()
                if tried.placement is not None:
                    self._send_placed(tried.placement)
        self._after_write(None)
        await self.dispatcher.dispatch_lagging()  # the claims it placed; the scanner does the rest

    def _send_placed(self, placement: Placement) -> None:
        """Send a claim the sweep placed to its node at once, in the trace of its placement
        (its creator's), so the apply and the claim's `ready` carry that trace."""
        with attached(placement.trace):
            self.dispatcher.wanted(placement.node)

    async def _place_after(
        self, after: PendingCursor | None, priority: Priority, conn: AsyncConnection
    ) -> PendingTry | None:
        return await self.claims.place_pending(conn, after, priority)


class _Freed(BaseModel):
    freed: bool


def _subject_node(subject: str) -> str:
    """The node a `qshare.node.<node>.…` subject names; InvalidInput when its token is no node
    name (its publisher chose it: a NUL, which Postgres text cannot hold, included)."""
    node = subjects.node_of(subject)
    if not is_node_name(node):
        raise InvalidInput.on("subject", f"{node[:64]!r} is not a node name")
    return node
