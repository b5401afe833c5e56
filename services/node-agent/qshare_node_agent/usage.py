"""Device-time usage per vGPU and per card, read from the driver's counters every
`usage_interval_s` and published on `qshare.node.<node>.usage` for the preemptor's
starvation watch. A card's `hp_ns` is the device time its high-priority vGPUs used in the
interval: the time low priority could not harvest there."""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from qshare.contracts import envelope, subjects
from qshare.contracts.agent import LOCAL_ID_LIMIT
from qshare.contracts.usage import CardUsage, NodeUsage, VgpuUsage
from qshare_driver import DriverError, Node, Priority, VgpuStats
from qshare_driver.client import now_ns

log = logging.getLogger(__name__)


class UsageReader:
    """Turns the driver's cumulative counters into per-interval usage."""

    def __init__(self, node: Node, node_name: str, uuids: dict[int, str]) -> None:
        self._node = node
        self._name = node_name
        self._uuids = uuids
        self._last_ns = now_ns()
        self._seen: dict[int, int] = {}

    @property
    def node_name(self) -> str:
        return self._name

    def read(self) -> NodeUsage:
        """Usage since the previous read; a vGPU first seen now is reported from the next."""
        now = now_ns()
        interval, self._last_ns = max(now - self._last_ns, 1), now
        cards = {index: CardUsage(gpu=gpu, hp_ns=0) for index, gpu in self._uuids.items()}
        seen: dict[int, int] = {}
        for stats in self._stats():
            seen[stats.id] = stats.device_ns
            if stats.id not in self._seen or stats.card not in cards:
                continue
            self._count(cards[stats.card], stats, max(stats.device_ns - self._seen[stats.id], 0))
        self._seen = seen
        return NodeUsage(node=self._name, interval_ns=interval, cards=list(cards.values()))

    def _stats(self) -> list[VgpuStats]:
        found = []
        for local_id in self._node.list_vgpus():
            try:
                found.append(self._node.vgpu_stats(local_id))
            except DriverError:  # destroyed between the listing and the read
                continue
        return found

    @staticmethod
    def _count(card: CardUsage, stats: VgpuStats, used_ns: int) -> None:
        if stats.priority is Priority.HIGH:
            card.hp_ns += used_ns
        if stats.id < LOCAL_ID_LIMIT:
            card.vgpus.append(VgpuUsage(local_id=stats.id, device_ns=used_ns))


async def report(
    reader: UsageReader, nc: Client, source: str, interval_s: float, registered: asyncio.Event
) -> None:
    """Once the node is registered, publish one usage message every `interval_s` until
    cancelled."""
    subject = subjects.usage(reader.node_name)
    await registered.wait()
    _start_interval(reader)
    while True:
        await asyncio.sleep(interval_s)
        try:
            usage = reader.read()  # shared-memory counters: ~0.1 ms for 4 cards, 10 vGPUs
            body = envelope.wrap(source, "io.qshare.node.usage", usage)
            await nc.publish(subject, envelope.encode(body))
        except Exception as error:
            log.warning("node %s: usage not reported (%s)", reader.node_name, error)


def _start_interval(reader: UsageReader) -> None:
    """The first interval starts now; a read that fails is logged (the vGPUs are then
    reported from the interval after the next read), never the end of the reports."""
    try:
        reader.read()
    except Exception as error:
        log.warning("node %s: usage counters not read (%s)", reader.node_name, error)
