"""Audit (s38): a heartbeat's time is the node's to write; one whose offset moves it past
either end of the calendar once in UTC is still a heartbeat, never an internal error."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client

from qshare.contracts import subjects
from tests.controlplane.conftest import Register


@pytest.mark.parametrize("sent", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
async def test_a_heartbeat_whose_time_leaves_the_calendar_in_utc_never_fails(
    nc: Client, register: Register, sent: str
) -> None:
    await register("hb", cards=1)
    body = {"source": "hb", "type": "io.qshare.node.heartbeat", "time": sent,
            "data": {"unhealthy": []}}  # fmt: skip
    reply = await nc.request(subjects.heartbeat("hb"), json.dumps(body).encode(), timeout=5)
    assert (reply.headers or {}).get("Nats-Service-Error-Code") is None, reply.data
