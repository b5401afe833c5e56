"""How each card is shared (policy, release mode and delay in force, LP window, device gate)
reaches `GET /v1/gpus` from its node's heartbeats; a node reports its own cards only."""

from __future__ import annotations

from typing import Any

import httpx
from nats.aio.client import Client

from qshare.contracts import envelope, subjects
from qshare.contracts.nodes import Heartbeat
from qshare.contracts.sharing import CardSharing
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth

ADMIN = auth(ADMIN_TOKEN)


def sharing(gpu: str, **change: Any) -> CardSharing:
    fields = {"gpu": gpu, "policy": "burst-share", "release_mode": "auto",
              "release_delay_s": 0.0005, "release_auto_bound_s": 0.001,
              "lp_window_s": 0.0002, "lp_device_gate": True} | change  # fmt: skip
    return CardSharing.model_validate(fields)


async def beat(nc: Client, node: str, *reports: CardSharing) -> None:
    body = envelope.wrap(node, "io.qshare.node.heartbeat", Heartbeat(sharing=list(reports)))
    await nc.request(subjects.heartbeat(node), envelope.encode(body), timeout=5)


async def beat_raw(nc: Client, node: str, data: dict[str, Any]) -> None:
    """A heartbeat as the given JSON, as a newer agent might send it."""
    body = envelope.encode(
        envelope.Envelope(source=node, type="io.qshare.node.heartbeat", data=data)
    )
    await nc.request(subjects.heartbeat(node), body, timeout=5)


async def served(api: httpx.AsyncClient) -> dict[str, Any]:
    return {g["uuid"]: g["sharing"] for g in (await api.get("/v1/gpus", headers=ADMIN)).json()}


async def test_a_cards_sharing_reported_in_a_heartbeat_is_served_with_the_card(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    await beat(nc, "n1", sharing("n1-g0"))
    assert (await served(api))["n1-g0"] == sharing("n1-g0").model_dump(mode="json")


async def test_a_card_whose_node_has_not_reported_its_sharing_is_served_without_it(
    register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    assert (await served(api))["n1-g0"] is None


async def test_a_later_report_replaces_the_earlier_one(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    await beat(nc, "n1", sharing("n1-g0"))
    await beat(nc, "n1", sharing("n1-g0", release_mode="fixed", release_auto_bound_s=None))
    assert (await served(api))["n1-g0"]["release_mode"] == "fixed"


async def test_a_node_reporting_another_nodes_card_changes_nothing(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    await register("n2", cards=1)
    await beat(nc, "n1", sharing("n2-g0"))
    assert (await served(api))["n2-g0"] is None


async def test_a_heartbeat_with_a_bad_sharing_report_is_refused_naming_the_field(
    nc: Client, register: Register
) -> None:
    await register("n1", cards=1)
    report = sharing("n1-g0").model_dump(mode="json") | {"lp_window_s": 5}
    data = {"sharing": [report]}
    body = envelope.encode(envelope.Envelope(source="test", type="io.qshare.hb", data=data))
    reply = await nc.request(subjects.heartbeat("n1"), body, timeout=5)
    assert reply.headers is not None and reply.headers["Nats-Service-Error-Code"] == "422"
    assert b"lp_window_s" in reply.data


async def test_a_cards_timeslice_and_why_it_was_refused_are_served_with_the_card(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=2)
    refused = "short: nvidia-smi exited with status 4: Insufficient Permissions"
    await beat(nc, "n1", sharing("n1-g0", timeslice="short"),
               sharing("n1-g1", timeslice="driver", timeslice_refused=refused))  # fmt: skip
    cards = await served(api)
    assert (cards["n1-g0"]["timeslice"], cards["n1-g0"]["timeslice_refused"]) == ("short", None)
    assert (cards["n1-g1"]["timeslice"], cards["n1-g1"]["timeslice_refused"]) == (
        "driver", refused)  # fmt: skip


async def test_a_heartbeat_naming_an_unknown_timeslice_is_refused_naming_the_levels(
    nc: Client, register: Register
) -> None:
    await register("n1", cards=1)
    report = sharing("n1-g0").model_dump(mode="json") | {"timeslice": "fastest"}
    data = {"sharing": [report]}
    body = envelope.encode(envelope.Envelope(source="test", type="io.qshare.hb", data=data))
    reply = await nc.request(subjects.heartbeat("n1"), body, timeout=5)
    assert reply.headers is not None and reply.headers["Nats-Service-Error-Code"] == "422"
    assert b"timeslice" in reply.data and b"'driver', 'default', 'short'" in reply.data


async def test_a_report_with_a_field_this_version_does_not_know_is_taken_without_it(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    report = sharing("n1-g0").model_dump(mode="json") | {"a_later_setting": 3}
    await beat_raw(nc, "n1", {"sharing": [report]})
    assert (await served(api))["n1-g0"] == sharing("n1-g0").model_dump(mode="json")


async def test_a_report_of_an_earlier_agent_is_served_with_its_timeslice_unknown(
    nc: Client, register: Register, api: httpx.AsyncClient
) -> None:
    await register("n1", cards=1)
    report = sharing("n1-g0").model_dump(mode="json", exclude={"timeslice", "timeslice_refused"})
    await beat_raw(nc, "n1", {"sharing": [report]})
    assert (await served(api))["n1-g0"]["timeslice"] is None
