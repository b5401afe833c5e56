"""Heartbeats apply card health in the order their node sent them: two replicas may take two
of one node's heartbeats at once (after a reconnect its buffered ones go out back to back),
and the one sent first may commit last. Before, it did: a card healed by the later heartbeat
was unhealthy again until the next one, and the health scan meanwhile released its claims
to place them elsewhere."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, subjects
from qshare.contracts.nodes import Heartbeat
from tests.controlplane.conftest import RULES, Register
from tests.controlplane.test_inventory_lifecycle import _card

NOW = datetime.now(UTC)


async def _beat(nc: Client, node: str, sent: datetime, unhealthy: list[str]) -> None:
    beat = envelope.wrap(node, "io.qshare.node.heartbeat", Heartbeat(unhealthy=unhealthy))
    beat.time = sent
    await nc.request(subjects.heartbeat(node), envelope.encode(beat), timeout=5)


async def test_a_heartbeat_sent_before_the_last_one_applied_changes_no_card(
    nc: Client, register: Register, engine: AsyncEngine
) -> None:
    await register("hb", cards=1)
    await _beat(nc, "hb", NOW + timedelta(seconds=1), [])
    await _beat(nc, "hb", NOW, ["hb-g0"])  # sent first, handled last
    assert await _card(engine, "hb-g0") == {
        "healthy": True, "retired": False, "allocated_mib": 0, "memory_mib": 16384,
    }  # fmt: skip


async def test_a_node_whose_clock_went_back_further_than_the_timeout_is_believed(
    nc: Client, register: Register, engine: AsyncEngine
) -> None:
    """A heartbeat older than the last by more than the node timeout is no reordering (the
    node would have been NotReady meanwhile) but a clock set back: it applies."""
    await register("hb", cards=1)
    await _beat(nc, "hb", NOW, [])
    back = NOW - timedelta(seconds=RULES.node_timeout_s + 60)
    await _beat(nc, "hb", back, ["hb-g0"])
    assert (await _card(engine, "hb-g0") or {})["healthy"] is False
    await _beat(nc, "hb", back + timedelta(seconds=5), [])
    assert (await _card(engine, "hb-g0") or {})["healthy"] is True


async def test_a_new_registration_forgets_the_last_heartbeats_time(
    nc: Client, register: Register, engine: AsyncEngine
) -> None:
    """An agent restarted on a node whose clock is now behind is believed from its first
    heartbeat."""
    await register("hb", cards=1)
    await _beat(nc, "hb", NOW + timedelta(seconds=10), [])
    await register("hb", cards=1)
    await _beat(nc, "hb", NOW, ["hb-g0"])
    assert (await _card(engine, "hb-g0") or {})["healthy"] is False


async def test_a_heartbeat_whose_time_is_odd_still_counts_and_never_fails(
    nc: Client, register: Register, engine: AsyncEngine
) -> None:
    """The time is the node's to write: one without a zone, one at the start of the calendar
    or at its end is a heartbeat all the same (answered, the card's health applied or not),
    never an internal error."""
    await register("hb", cards=1)
    for sent in ("2026-01-01T00:00:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"):
        body = {"source": "hb", "type": "io.qshare.node.heartbeat", "time": sent,
                "data": {"unhealthy": []}}  # fmt: skip
        reply = await nc.request(subjects.heartbeat("hb"), json.dumps(body).encode(), timeout=5)
        assert (reply.headers or {}).get("Nats-Service-Error-Code") is None, reply.data
