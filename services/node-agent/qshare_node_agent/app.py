"""The node agent process: discovers cards, owns the node's driver segment, registers and
heartbeats over NATS, converges to the allocator's desired vGPUs, and publishes the
driver's events. Several agents may share one process (the cluster benchmark does)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import Metric
from pydantic import BaseModel, ValidationError

from qshare import bus, health
from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.agent import AnnounceRequest, DesiredVgpu
from qshare.contracts.domain import (
    AGENT_FEATURES_LABEL,
    APPLY_SHARING_FEATURE,
    APPLY_SUSPENDED_FEATURE,
    HOSTNAME_LABEL,
    NODE_LABEL,
    POLICY_LABEL,
    CardPolicy,
)
from qshare.contracts.errors import InvalidInput, QshareError, Unavailable
from qshare.contracts.nodes import GpuSpec, Heartbeat, NodeRegistration, NodeView
from qshare.contracts.sharing import CardSharing
from qshare.contracts.tracing import flush_tracing, handling, setup_tracing
from qshare.metrics_http import MetricsServer, serve_metrics
from qshare.natsauth import ServiceRole
from qshare.service import Service, cancelled
from qshare_driver import Event, EventKind, Node, NotFoundError
from qshare_node_agent import metrics, stopping, timeslice
from qshare_node_agent.announce import Announcer
from qshare_node_agent.asked_sharing import SharingKeeper
from qshare_node_agent.commands import Commands
from qshare_node_agent.converge import Converger
from qshare_node_agent.discovery import Card, discover, unhealthy
from qshare_node_agent.events import POLL_S, EventPump
from qshare_node_agent.hidden_pids import HiddenPidWatch
from qshare_node_agent.segment import existing_vgpus, open_segment
from qshare_node_agent.settings import NodeAgentSettings
from qshare_node_agent.sharing import cards_sharing
from qshare_node_agent.timeslice import CardTimeslice
from qshare_node_agent.usage import UsageReader, report

if TYPE_CHECKING:
    from qshare_node_agent.kubernetes_wiring import AgentPlugins

log = logging.getLogger(__name__)
BACKOFF_MAX_S = 10.0
READER_HALT_S = 2 * POLL_S
"""How long a stop waits for the event reader to leave the driver before closing the segment
(its reads return at least every POLL_S)."""
HEALTH_READ_MIN_S = 5.0
"""A card health read counts as failed once it takes a heartbeat period and at least this
long (NVML answers in milliseconds; a busy host's short stall must not fail every card)."""


class NodeAgent(Service):
    """One node. Use `async with NodeAgent(settings):` or `await NodeAgent(settings).run()`."""

    def __init__(self, settings: NodeAgentSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self.source = f"qshare-node-agent/{settings.name}"
        self.cards: list[Card] = []
        self._node: Node | None = None
        self._timeslices: dict[str, CardTimeslice] = {}
        self._nc: Client | None = None
        self._commands: Commands | None = None
        self._metrics: MetricsServer | None = None
        self._pump: EventPump | None = None
        self.announcer: Announcer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._registering: asyncio.Task[None] | None = None
        self._plugins: AgentPlugins | None = None
        self._health_read: asyncio.Future[list[str]] | None = None
        self.registered = asyncio.Event()
        self.stop_step_s = stopping.STEP_S
        """The longest one step of `stop()` may take (the NATS close's own two 5 s bounds
        fit in it)."""
        self._stopping = False
        """Set first thing in `stop()`: commands and announce requests then start no work."""
        self.reregistrations = 0
        """Registrations made again because the allocator asked (`cmd.register`)."""
        self.relabels = 0
        """Registrations made again because the node's labels changed while it ran."""
        self._registered_labels: dict[str, str] | None = None
        """The labels of the last registration the allocator answered."""
        self._node_labels: dict[str, str] = {}
        """The Kubernetes Node's labels it registers (QSHARE_K8S_NODE_LABELS), as last read."""
        self._health: health.HealthServer | None = None
        self.probes = health.Probes()
        self.probes.live["nats"] = health.nats_not_closed(lambda: self._nc)
        self.probes.live["tasks"] = health.tasks_running(self._running)
        self.probes.live["event reader"] = self._reader_check
        self.probes.ready["nats"] = health.nats_connected(lambda: self._nc)
        self.probes.ready["segment"] = self._segment_check
        self.probes.ready["registration"] = self._registration_check

    @property
    def applied(self) -> dict[int, DesiredVgpu]:
        """The allocator's vGPUs this agent holds in its segment, by driver id."""
        assert self._commands is not None, "node agent not started"
        return self._commands.converger.held

    @property
    def node(self) -> Node:
        assert self._node is not None, "node agent not started"
        return self._node

    async def start(self) -> None:
        self._health = await health.serve(self.probes, self.settings)
        setup_tracing("qshare-node-agent")
        self.cards = discover(self.settings)
        uuids = [c.uuid for c in self.cards]
        self._timeslices = await asyncio.to_thread(timeslice.apply, self.settings, uuids)
        self._node, adopted = open_segment(self.settings, self.cards)
        by_uuid = {c.uuid: c for c in self.cards}
        keeper = SharingKeeper(self._node, self.settings, by_uuid, timeslices=self._timeslices)
        converger = Converger(self._node, by_uuid, sharing=keeper)
        if adopted:
            converger.adopt(existing_vgpus(self._node, self.cards))
        self._commands = Commands(self.name, self._node, converger)
        if self.settings.kubernetes:  # before NATS: the kubelet's plugins need no control plane
            self._start_plugins(converger)
            await self._follow_node_label()  # registered with the label's policy
        self._nc = await self._connect()
        await self._nc.subscribe(subjects.node_commands(self.name), cb=self._on_command)
        await self._nc.subscribe(subjects.NODES_ANNOUNCE, cb=self._on_announce)
        await bus.settled(self._nc)
        pump = EventPump(self._node, self._nc, self.name, {c.index: c.uuid for c in self.cards})
        self.announcer = Announcer(
            pump, [c.index for c in self.cards], self.settings.announce_interval_s
        )
        # the cards' present state, adopted or new: a preemptor may hold a card busy from
        # before a reboot (a new segment), and only an idle from this card would free it
        pump.announce_cards(c.index for c in self.cards)
        self.announcer.announced()
        pump.listeners.append(self._observe)
        pump.listeners.append(HiddenPidWatch(self.name))
        pump.start()
        self._pump = pump
        self._tasks.append(asyncio.create_task(self._register_then_beat(), name="heartbeats"))
        if self.settings.usage_interval_s:
            reader = UsageReader(self._node, self.name, {c.index: c.uuid for c in self.cards})
            interval = self.settings.usage_interval_s
            usage = report(reader, self._nc, self.source, interval, self.registered)
            self._tasks.append(asyncio.create_task(usage, name="usage reports"))
        self._metrics = serve_metrics(self.settings, metrics.DriverCollector(self))
        self.probes.serving()
        log.info("node agent %s: %d cards, segment %s", self.name, len(self.cards),
                 self.settings.segment_name)  # fmt: skip

    def _start_plugins(self, converger: Converger) -> None:
        from qshare_node_agent.kubernetes_wiring import start_plugins

        self._plugins = start_plugins(converger, self.cards)
        self._tasks.append(asyncio.create_task(self._watch_cards(), name="kubernetes cards"))

    async def stop(self) -> None:
        """Every step runs, each bounded by `stop_step_s`, whatever the others did (a step
        that fails or hangs is logged by name and left); a second call finds nothing left."""
        self._stopping = True
        self.probes.stopping()
        steps = [
            ("the health server", self._stop_health),
            ("the metrics server", self._stop_metrics),
            ("the agent's tasks", self._stop_tasks),
            ("the announcer", self._stop_announcer),
            ("the kubelet plugins", self._stop_plugins),
            ("the event pump", self._stop_pump),
            ("the NATS connection", self._stop_nats),
            (f"driver segment {self.settings.segment_name}", self._stop_segment),
            ("flushing traces", lambda: stopping.in_thread(flush_tracing)),
        ]
        for what, action in steps:
            await stopping.step(what, action, self.stop_step_s)

    async def _stop_health(self) -> None:
        server, self._health = self._health, None
        if server is not None:
            await server.stop()

    async def _stop_metrics(self) -> None:
        server, self._metrics = self._metrics, None
        if server is not None:
            await stopping.in_thread(server.stop)

    async def _stop_tasks(self) -> None:
        registering, self._registering = self._registering, None
        tasks, self._tasks = [*self._tasks, *([registering] if registering else [])], []
        for task in tasks:
            await cancelled(task)

    async def _stop_announcer(self) -> None:
        if self.announcer is not None:  # kept: stopping it again finds nothing to cancel
            await self.announcer.stop()

    async def _stop_plugins(self) -> None:
        plugins, self._plugins = self._plugins, None
        if plugins is not None:
            await stopping.in_thread(plugins.stop)

    async def _stop_pump(self) -> None:
        if self._pump is not None:  # kept: the segment's step asks whether it still reads
            await self._pump.stop()

    async def _stop_nats(self) -> None:
        if self._nc is not None:  # kept: a late callback still finds it (closed)
            await bus.close(self._nc)

    async def _stop_segment(self) -> None:
        pump = self._pump
        within_s = min(READER_HALT_S, self.stop_step_s / 2)  # inside the step's own bound
        if pump is not None and not await asyncio.to_thread(pump.halt, within_s):
            log.error("stopping: driver segment %s left open: the event reader still reads it",
                      self.settings.segment_name)  # fmt: skip
            return  # closing would unmap the ring under it; the next agent adopts the segment
        node, self._node = self._node, None
        if node is not None:
            await stopping.in_thread(node.leave if self.settings.keep_segment_on_stop
                                     else node.close)  # fmt: skip

    def _running(self) -> list[asyncio.Task[None]]:
        """The tasks that must run as long as the agent: heartbeats, usage, the event pump,
        the cards' health for Kubernetes."""
        pump = [self._pump.task] if self._pump is not None and self._pump.task else []
        return [*self._tasks, *pump]

    async def _reader_check(self) -> str | None:
        if self._pump is None or self._pump.reading:
            return None
        return "the thread reading the driver's event ring ended"

    async def _segment_check(self) -> str | None:
        if self._node is None:
            return f"driver segment {self.settings.segment_name} not open"
        await asyncio.to_thread(self._node.list_cards)  # the segment answers
        return None

    async def _registration_check(self) -> str | None:
        return None if self.registered.is_set() else "not registered with an allocator yet"

    async def _connect(self) -> Client:
        options = self.settings.bus_as(self.source, ServiceRole.NODE, self.name)
        return await bus.connect(options, reconnected=self._reconnected)

    async def _reconnected(self) -> None:
        """Card events published while NATS was away may have reached no preemptor."""
        self._request_announcement()

    def _request_announcement(self) -> None:
        """Announce the cards' state (rate-limited); nothing once the agent is stopping."""
        if self.announcer is not None and not self._stopping:
            self.announcer.request()

    async def _on_announce(self, msg: Msg) -> None:
        """`qshare.nodes.announce`: publish the cards' present state again (rate-limited)."""
        try:
            envelope.decode(msg.data).payload(AnnounceRequest)
        except ValidationError as exc:
            log.warning("node agent %s: malformed announce request ignored: %s", self.name,
                        exc.errors()[:3])  # fmt: skip
            return
        self._request_announcement()

    def registration(self) -> NodeRegistration:
        gpus = [
            GpuSpec(uuid=c.uuid, index=c.index, model=c.model, memory=c.memory_mib)
            for c in self.cards
        ]
        shm_dir = str(self.settings.shm_dir) if self.settings.shm_dir is not None else None
        return NodeRegistration(
            name=self.name, labels=self._labels(), gpus=gpus,
            segment=self.settings.segment_name, shm_dir=shm_dir,
            applied_generation=self._applied_generation(),
        )  # fmt: skip

    def _applied_generation(self) -> int:
        """The generation the converger holds (-1 before its first apply, and once the node
        was forgotten: `new_numbering`), so a registration of the running agent (its labels
        changed) does not make the allocator take its confirmed state for none."""
        return self._commands.converger.generation if self._commands is not None else -1

    def _labels(self) -> dict[str, str]:
        own = {POLICY_LABEL: self._own_policy().value, NODE_LABEL: self.name}
        if self.settings.kubernetes:
            own[HOSTNAME_LABEL] = self.name  # the scheduler extender places by it
        mine = {AGENT_FEATURES_LABEL: f"{APPLY_SHARING_FEATURE},{APPLY_SUSPENDED_FEATURE}"}
        return own | self.settings.labels | self._node_labels | mine

    def _own_policy(self) -> CardPolicy:
        """The cards' policy of their own: the node label's, else the agent's setting."""
        sharing = self._commands.converger.sharing if self._commands is not None else None
        return self.settings.policy if sharing is None else sharing.own_settings().policy

    async def _register_then_beat(self) -> None:
        await self._register()
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            if not await self._relabel():
                await self._beat()

    async def _relabel(self) -> bool:
        """Register again, in place of a heartbeat (a registration counts as one), when the
        node's labels are not those last registered: the policy the agent took from the
        Node's label since, say. True once registered; a failure is logged, and the next
        heartbeat period tries again (the beat still goes meanwhile)."""
        labels, before = self._labels(), self._registered_labels
        if before is None or labels == before:
            return False
        changed = sorted(k for k in labels.keys() | before.keys() if labels.get(k) != before.get(k))
        log.info("node agent %s: labels %s changed since the registration; registering again",
                 self.name, changed)  # fmt: skip
        if not await self._register_once():
            return False
        self.relabels += 1
        return True

    async def _register(self) -> None:
        """Register, retrying with backoff until an allocator answers."""
        wait = 0.2
        while not await self._register_once(f"retrying in {wait:.1f} s"):
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF_MAX_S)

    async def _register_once(self, then: str = "trying again next heartbeat") -> bool:
        """One registration; False (logged, saying what comes `then`) when it failed."""
        assert self._nc is not None
        registration = self.registration()
        try:
            await rpc.call(self._nc, subjects.node_register(self.name), self.source,
                           registration, NodeView,
                           timeout=self.settings.register_timeout_s)  # fmt: skip
        except Exception as error:  # no answer, a refusal, or one it cannot read
            detail = error.detail if isinstance(error, QshareError) else repr(error)
            log.warning("node agent %s: registration failed (%s); %s", self.name, detail, then)
            return False
        self._registered_labels = registration.labels
        self.registered.set()
        return True

    def register_again(self) -> None:
        """`cmd.register`: the allocator got a heartbeat from this node and does not know it
        (deleted over REST while this agent ran). Register again as at the start (the
        allocator then sends the desired vGPUs), then announce the cards' state: events about
        them were ignored while they were not in the inventory. One at a time."""
        if not self.registered.is_set():
            return  # the first registration is still under way
        if self._registering is not None and not self._registering.done():
            return
        log.warning("node agent %s: the allocator does not know this node; registering again",
                    self.name)  # fmt: skip
        self._registering = asyncio.create_task(self._register_and_announce())

    async def _register_and_announce(self) -> None:
        assert self._commands is not None
        self._commands.converger.new_numbering()
        await self._register()
        self.reregistrations += 1
        self._request_announcement()

    async def _beat(self) -> None:
        assert self._nc is not None
        beat = Heartbeat(unhealthy=await self._unhealthy(), sharing=self._sharing())
        body = envelope.wrap(self.source, "io.qshare.node.heartbeat", beat)
        try:
            await self._nc.publish(subjects.heartbeat(self.name), envelope.encode(body))
        except Exception as error:
            log.warning("node agent %s: heartbeat not sent (%s)", self.name, error)

    async def _watch_cards(self) -> None:
        """Read the cards' health and the Node's policy label here every heartbeat period and
        tell the kubelet plugins, with no allocator or NATS needed: a card that turns
        unhealthy while the control plane is away is withdrawn from Kubernetes all the same."""
        while True:
            await self._follow_node_label()
            self._publish_cards(await self._unhealthy())
            await asyncio.sleep(self.settings.heartbeat_s)

    async def _follow_node_label(self) -> None:
        """Give the cards the policy the Node's label `qshare.io/policy` names, and keep the
        Node's labels the agent registers (read in a thread); a Node that cannot be read
        leaves both as they are."""
        if self._plugins is None:
            return
        try:
            policy, self._node_labels = await asyncio.to_thread(self._plugins.read_node)
            self._plugins.take_node_policy(policy)
        except Exception as error:  # the API's refusal, or a card the driver refused: next round
            log.warning("node agent %s: node label %s not followed (%r)", self.name,
                        POLICY_LABEL, error)  # fmt: skip

    def _publish_cards(self, unhealthy: list[str]) -> None:
        """Tell the kubelet plugins the cards' health and policy as read now."""
        if self._plugins is None:
            return
        try:
            self._plugins.cards_seen(unhealthy)
        except Exception as error:  # the loop goes on
            log.warning("node agent %s: cards not published to Kubernetes (%r)", self.name,
                        error)  # fmt: skip

    def _sharing(self) -> list[CardSharing]:
        """How each card is shared; none when the driver cannot say (the beat still goes)."""
        if self._node is None:
            return []
        try:
            return cards_sharing(self._node, self.cards, self._timeslices)
        except Exception as error:
            log.warning("node agent %s: card sharing not read (%r)", self.name, error)
            return []

    async def _unhealthy(self) -> list[str]:
        """The unhealthy cards; every card when their health cannot be read (as NVML counts a
        card it cannot query) or the read takes over a heartbeat period (NVML hangs on a card
        that fell off the bus; HEALTH_READ_MIN_S at least), so that a failed read never
        stops the heartbeats. One read at a time: a hung one is waited for again, not joined
        by another thread."""
        if self._health_read is None or self._health_read.done():
            read = asyncio.ensure_future(asyncio.to_thread(unhealthy, self.settings, self.cards))
            read.add_done_callback(_retrieved)
            self._health_read = read
        bound = max(self.settings.heartbeat_s, HEALTH_READ_MIN_S)
        try:
            return await asyncio.wait_for(asyncio.shield(self._health_read), bound)
        except TimeoutError:
            why = f"no answer in {bound:g} s"
        except Exception as error:
            why = repr(error)
        log.warning("node agent %s: card health not read (%s); every card reported unhealthy",
                    self.name, why)  # fmt: skip
        return [c.uuid for c in self.cards]

    async def _on_command(self, msg: Msg) -> None:
        with handling("qshare.node_agent", msg.subject, msg.headers):
            await self._answer(msg)

    async def _answer(self, msg: Msg) -> None:
        assert self._nc is not None and self._commands is not None
        verb = msg.subject.rsplit(".", 1)[-1]
        try:
            if self._stopping:  # its tasks may be cancelled and its plugins stopped already
                raise Unavailable(f"node agent {self.name} is stopping; {verb} not done")
            model = self._commands.payload_type(verb)
            payload = _decode(msg, model)
            result = self._command(verb, payload)
        except QshareError as error:
            await rpc.reply_error(self._nc, msg, error)
            return
        except Exception:
            log.exception("node agent %s: command %s failed", self.name, verb)
            await rpc.reply_error(self._nc, msg, QshareError("internal error; see node agent logs"))
            return
        await rpc.reply_ok(self._nc, msg, self.source, result)

    def _command(self, verb: str, payload: Any) -> BaseModel | None:
        assert self._commands is not None
        if verb == "register":
            self.register_again()
            return None
        return self._commands.handle(verb, payload)

    def _observe(self, event: Event) -> None:
        """Preemption episode lengths for the metrics."""
        if event.card is None:
            return
        if event.kind is EventKind.IDLE and event.value:  # 0: a state found at a restart
            gpu = next((c.uuid for c in self.cards if c.index == event.card), "")
            metrics.BUSY_SECONDS.labels(self.name, gpu).observe(event.value / 1e9)

    def metric_families(self) -> Iterator[Metric]:
        if self._node is None or self._commands is None:
            return
        yield from self._vgpu_families(self._node, self._commands.converger.held)
        yield from self._card_families(self._node)
        yield from metrics.families(metrics.NODE_FIGURES, metrics.NODE_LABELS,
                                    [([self.name], self._node)])  # fmt: skip

    def _vgpu_families(self, node: Node, held: dict[int, DesiredVgpu]) -> Iterator[Metric]:
        """Per vGPU, labelled with its claim, card and priority (dashboards join on claim);
        one an apply destroyed since `held` was read is left out of this scrape."""
        rows = []
        for i, v in list(held.items()):
            try:
                stats = node.vgpu_stats(i)
            except NotFoundError:
                continue
            rows.append(([self.name, str(i), str(v.claim_id), v.gpu, v.priority], stats))
        return metrics.families(metrics.VGPU_FIGURES, metrics.VGPU_LABELS, rows)

    def _card_families(self, node: Node) -> Iterator[Metric]:
        """Per card: high priority's hold, the release delay and LP window in force, vGPUs."""
        rows = [([self.name, c.uuid], node.card_stats(c.index)) for c in self.cards]
        yield from metrics.families(metrics.CARD_FIGURES, metrics.CARD_LABELS, rows)
        modes = [([self.name, c.uuid], node.release_auto(c.index)) for c in self.cards]
        yield from metrics.families(metrics.RELEASE_FIGURES, metrics.CARD_LABELS, modes)


def _retrieved(read: asyncio.Future[list[str]]) -> None:
    """Take a health read's outcome (the waiter that timed out left it unretrieved)."""
    if not read.cancelled():
        read.exception()


def _decode(msg: Msg, model: type) -> object:
    try:
        return envelope.decode(msg.data).payload(model)
    except ValidationError as exc:
        fields = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
        raise InvalidInput("malformed command: " + "; ".join(fields)) from exc
