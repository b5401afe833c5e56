"""What the control plane does with a request to share a card otherwise (`PATCH` and `DELETE
/v1/gpus/{uuid}/sharing`, admins): it keeps the request whole (what it leaves out keeps what
was asked before), gives the node a new desired generation to carry it, shows it pending until
the node confirms that generation, and refuses what no node could apply, naming the field."""

from __future__ import annotations

from typing import Any

import httpx
from nats.aio.client import Client
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.agent import ApplyDesired
from qshare.contracts.domain import AGENT_FEATURES_LABEL
from qshare.contracts.nodes import NodeRegistration, NodeView
from qshare.contracts.schema import nodes
from qshare.contracts.sharing import SharingSettings, WantedSharing
from qshare_allocator.nodes.desired import desired_state
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth, card

ADMIN = auth(ADMIN_TOKEN)


async def register_with_agent(nc: Client, name: str, features: str | None = "apply-sharing") -> str:
    """A node as its agent registers it (with a driver segment and the features it announces;
    None: an agent of an earlier version, which announces none); returns its first card."""
    labels = {} if features is None else {AGENT_FEATURES_LABEL: features}
    registration = NodeRegistration.model_validate(
        {"name": name, "gpus": [card(f"{name}-g0", 0)], "segment": f"qshare-{name}",
         "labels": labels}
    )  # fmt: skip
    await rpc.call(nc, subjects.NODES_REGISTER, "test", registration, NodeView)
    return f"{name}-g0"


async def patch(api: httpx.AsyncClient, gpu: str, **change: Any) -> httpx.Response:
    return await api.patch(f"/v1/gpus/{gpu}/sharing", json=change, headers=ADMIN)


async def desired_generation(engine: AsyncEngine, node: str) -> int:
    async with engine.connect() as conn:
        query = select(nodes.c.desired_generation).where(nodes.c.name == node)
        return int((await conn.execute(query)).scalar_one())


async def test_a_request_is_kept_and_shown_pending_until_the_node_applies_it(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s1")
    response = await patch(api, gpu, policy="fixed-share")
    assert response.status_code == 200
    shown = (await api.get(f"/v1/gpus/{gpu}", headers=ADMIN)).json()
    assert shown["sharing_requested"]["policy"] == "fixed-share"
    assert shown["sharing_pending"] is True


async def test_a_request_gives_the_node_a_new_desired_generation(
    api: httpx.AsyncClient, nc: Client, engine: AsyncEngine
) -> None:
    gpu = await register_with_agent(nc, "s2")
    before = await desired_generation(engine, "s2")
    await patch(api, gpu, lp_window_s=0.0002)
    assert await desired_generation(engine, "s2") == before + 1


async def test_asking_again_what_is_asked_changes_no_generation(
    api: httpx.AsyncClient, nc: Client, engine: AsyncEngine
) -> None:
    gpu = await register_with_agent(nc, "s3")
    await patch(api, gpu, policy="burst-share")
    before = await desired_generation(engine, "s3")
    await patch(api, gpu, policy="burst-share")
    assert await desired_generation(engine, "s3") == before


async def test_what_a_request_leaves_out_keeps_what_was_asked_before(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s4")
    await patch(api, gpu, policy="burst-share", lp_device_gate=True)
    asked = (await patch(api, gpu, lp_window_s=0.0004)).json()["sharing_requested"]
    assert (asked["policy"], asked["lp_device_gate"], asked["lp_window_s"]) == (
        "burst-share",
        True,
        0.0004,
    )


async def test_fixed_release_drops_the_bound_asked_before(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s5")
    await patch(api, gpu, release_mode="auto", release_auto_bound_s=0.002)
    asked = (await patch(api, gpu, release_mode="fixed")).json()["sharing_requested"]
    assert (asked["release_mode"], asked["release_auto_bound_s"]) == ("fixed", None)


async def test_a_bound_alone_changes_the_bound_of_auto_release_asked_before(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s6")
    await patch(api, gpu, release_mode="auto", release_auto_bound_s=0.002)
    asked = (await patch(api, gpu, release_auto_bound_s=0.003)).json()["sharing_requested"]
    assert (asked["release_mode"], asked["release_auto_bound_s"]) == ("auto", 0.003)


async def test_a_bound_without_auto_release_is_refused_naming_it(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s7")
    response = await patch(api, gpu, release_auto_bound_s=0.002)
    assert response.status_code == 422
    assert "release_auto_bound_s" in response.text


async def test_auto_release_with_no_delay_to_choose_up_to_is_refused(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s8")
    response = await patch(
        api, gpu, release_mode="auto", release_auto_bound_s=0.002, release_delay_s=0
    )
    assert response.status_code == 422
    assert "release_delay_s" in response.text


async def test_an_empty_request_is_refused(api: httpx.AsyncClient, nc: Client) -> None:
    gpu = await register_with_agent(nc, "s9")
    response = await patch(api, gpu)
    assert response.status_code == 422
    assert "name at least one of" in response.text


async def test_an_unknown_setting_is_refused_naming_it(api: httpx.AsyncClient, nc: Client) -> None:
    gpu = await register_with_agent(nc, "s10")
    response = await patch(api, gpu, release_delay_ms=100)
    assert response.status_code == 422
    assert "release_delay_ms" in response.text


async def test_a_window_out_of_range_is_refused_naming_it(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s11")
    response = await patch(api, gpu, lp_window_s=2)
    assert response.status_code == 422
    assert "lp_window_s" in response.text


async def test_asking_for_an_unknown_card_is_404(api: httpx.AsyncClient) -> None:
    assert (await patch(api, "no-such-card", policy="fixed-share")).status_code == 404


async def test_a_card_of_a_node_without_an_agent_is_a_conflict(
    api: httpx.AsyncClient, register: Register
) -> None:
    await register("s12")  # an inventory entry made by hand: nothing would apply it
    response = await patch(api, "s12-g0", policy="fixed-share")
    assert response.status_code == 409
    assert "no node agent" in response.text


async def test_a_tenant_cannot_ask_how_a_card_is_shared(
    api: httpx.AsyncClient, nc: Client, tenant_tokens: dict[str, str]
) -> None:
    gpu = await register_with_agent(nc, "s13")
    response = await api.patch(
        f"/v1/gpus/{gpu}/sharing", json={"policy": "fixed-share"},
        headers=auth(tenant_tokens["team-a"]),
    )  # fmt: skip
    assert response.status_code == 403


async def test_withdrawing_a_request_clears_it(api: httpx.AsyncClient, nc: Client) -> None:
    gpu = await register_with_agent(nc, "s14")
    await patch(api, gpu, policy="fixed-share")
    withdrawn = await api.delete(f"/v1/gpus/{gpu}/sharing", headers=ADMIN)
    assert (withdrawn.status_code, withdrawn.json()["sharing_requested"]) == (200, None)


async def test_asking_of_a_card_whose_agent_is_of_an_earlier_version_is_a_conflict(
    api: httpx.AsyncClient, nc: Client, engine: AsyncEngine
) -> None:
    """Its agent would refuse every apply that carried the request, claims included: the
    request is refused instead, saying to upgrade the agent, and nothing is kept."""
    gpu = await register_with_agent(nc, "s15", features=None)
    before = await desired_generation(engine, "s15")
    response = await patch(api, gpu, policy="fixed-share")
    assert response.status_code == 409
    assert "upgrade its node agent" in response.text
    shown = (await api.get(f"/v1/gpus/{gpu}", headers=ADMIN)).json()
    assert shown["sharing_requested"] is None
    assert await desired_generation(engine, "s15") == before


async def test_an_agent_announcing_other_features_only_cannot_take_a_request(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s16", features="something-else, other")
    assert (await patch(api, gpu, policy="fixed-share")).status_code == 409


async def test_withdrawing_from_a_card_of_an_earlier_agent_is_allowed(
    api: httpx.AsyncClient, nc: Client
) -> None:
    gpu = await register_with_agent(nc, "s17")
    await patch(api, gpu, policy="fixed-share")
    await register_with_agent(nc, "s17", features=None)  # the agent was downgraded
    withdrawn = await api.delete(f"/v1/gpus/{gpu}/sharing", headers=ADMIN)
    assert (withdrawn.status_code, withdrawn.json()["sharing_requested"]) == (200, None)


async def test_a_downgraded_agent_gets_applies_without_the_sharing_asked(
    api: httpx.AsyncClient, nc: Client, engine: AsyncEngine
) -> None:
    """So it goes on taking claims; the request stays kept, and pending, until the agent
    that can apply it is back."""
    gpu = await register_with_agent(nc, "s18")
    await patch(api, gpu, policy="fixed-share")
    async with engine.connect() as conn:
        upgraded = await desired_state(conn, "s18")
    await register_with_agent(nc, "s18", features=None)
    async with engine.connect() as conn:
        downgraded = await desired_state(conn, "s18")
    assert upgraded is not None and [w.gpu for w in upgraded.sharing] == [gpu]
    assert downgraded is not None and downgraded.sharing == []
    assert "sharing" not in downgraded.model_dump(mode="json")
    shown = (await api.get(f"/v1/gpus/{gpu}", headers=ADMIN)).json()
    assert shown["sharing_requested"]["policy"] == "fixed-share"


async def test_getting_an_unknown_card_is_404(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/gpus/no-such-card", headers=ADMIN)).status_code == 404


def test_a_desired_state_asking_no_sharing_has_no_sharing_field() -> None:
    """So a node agent of an earlier version, which refuses fields it does not know, still
    takes every apply until sharing is asked of one of its cards."""
    desired = ApplyDesired(node="n", generation=1, vgpus=[])
    assert "sharing" not in desired.model_dump(mode="json")


def test_a_desired_state_carries_the_sharing_asked() -> None:
    wanted = WantedSharing(gpu="g0", settings=SharingSettings(policy="fixed-share"))
    desired = ApplyDesired(node="n", generation=1, vgpus=[], sharing=[wanted])
    assert desired.model_dump(mode="json")["sharing"][0]["settings"]["policy"] == "fixed-share"
