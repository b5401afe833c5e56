"""The control-plane part of `qshare demo`: embedded Postgres and NATS, the allocator and the
REST API in-process, a few simulated nodes, claims of both priorities placed over REST.

Run alone with `python -m qshare.demo_controlplane`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from qshare.contracts.quantities import format_mib
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.settings import ClusterSettings
from qshare.stack import serving
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, free_port

ADMIN_TOKEN = "qs_demo_admin"
NODES = [
    ("gpu-a1", {"zone": "a"}, "A100-80GB", "80Gi", 2),
    ("gpu-a2", {"zone": "a"}, "A10-24GB", "24Gi", 4),
    ("gpu-b1", {"zone": "b", "qshare.io/policy": "burst-share"}, "T4-16GB", "16Gi", 1),
]
CLAIMS: list[tuple[str, dict[str, Any]]] = [
    ("online inference", {"priority": "high", "vcore": 30, "vmemory": "8Gi"}),
    ("offline training", {"priority": "low", "vcore": 60, "vmemory": "20Gi"}),
    ("online, 2 cards in zone a", {"priority": "high", "vcore": 40, "vmemory": "4Gi", "count": 2,
                                   "node_selector": {"zone": "a"}}),
    ("offline batch, binpacked", {"priority": "low", "vcore": 20, "vmemory": "2Gi",
                                  "placement": {"node": "binpack", "card": "binpack"}}),
    ("online on the T4", {"priority": "high", "vcore": 70, "vmemory": "6Gi",
                          "node_selector": {"zone": "b"}}),
    ("second online on the T4", {"priority": "high", "vcore": 50, "vmemory": "4Gi",
                                 "node_selector": {"zone": "b"}}),
    ("offline on the T4", {"priority": "low", "vcore": 50, "vmemory": "4Gi",
                           "node_selector": {"zone": "b"}}),
]  # fmt: skip


async def run_controlplane_demo(out: Callable[[str], None] = print) -> None:
    out("control plane: starting embedded Postgres and NATS, the allocator and the API")
    async with _control_plane() as api:
        await _register_nodes(api, out)
        tenant = await _issue_tenant_token(api)
        placed = await _create_claims(api, tenant, out)
        await _release_and_replace(api, tenant, placed, out)
        out(await _gpu_table(api))
    out("control plane: stopped and cleaned up")


@contextlib.asynccontextmanager
async def _control_plane() -> AsyncIterator[httpx.AsyncClient]:
    from qshare_allocator.app import Allocator
    from qshare_allocator.migrate import upgrade
    from qshare_allocator.settings import AllocatorSettings
    from qshare_api.app import create_app
    from qshare_api.settings import ApiSettings

    rules = ClusterSettings()
    identities = NatsAuth.generate()
    as_allocator = identities.credentials(ServiceRole.ALLOCATOR)
    as_api = identities.credentials(ServiceRole.API)
    async with (
        EmbeddedPostgres(durable=False) as pg,
        EmbeddedNats(config=identities.server_config()) as bus,
    ):
        await upgrade(pg.url)
        allocator = AllocatorSettings(
            database_url=pg.url, nats_url=bus.url, cluster=rules,
            nats_user=as_allocator.user, nats_password=as_allocator.password,
        )  # fmt: skip
        port = free_port()
        api = ApiSettings(database_url=pg.url, nats_url=bus.url, port=port, cluster=rules,
                          bootstrap_admin_token=ADMIN_TOKEN, nats_user=as_api.user,
                          nats_password=as_api.password)  # fmt: skip
        async with Allocator(allocator), serving(create_app(api), "127.0.0.1", port):
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=headers
            ) as http:
                yield http


async def _register_nodes(api: httpx.AsyncClient, out: Callable[[str], None]) -> None:
    for name, labels, model, memory, cards in NODES:
        gpus = [{"uuid": f"{name}-gpu{i}", "index": i, "model": model, "memory": memory}
                for i in range(cards)]  # fmt: skip
        response = await api.post("/v1/nodes", json={"name": name, "labels": labels, "gpus": gpus})
        response.raise_for_status()
        out(f"  registered {name}: {cards} × {model} ({memory}), labels {labels}")


async def _issue_tenant_token(api: httpx.AsyncClient) -> dict[str, str]:
    body = {"name": "demo", "tenant": "ml-team", "role": "tenant"}
    token = (await api.post("/v1/tokens", json=body)).json()["token"]
    return {"Authorization": f"Bearer {token}"}


async def _create_claims(
    api: httpx.AsyncClient, tenant: dict[str, str], out: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    from qshare_api.cli import table

    made: dict[str, dict[str, Any]] = {}
    for label, spec in CLAIMS:
        response = await api.post("/v1/claims", json=spec, headers=tenant)
        response.raise_for_status()
        made[label] = response.json()
    rows = [_claim_row(label, claim) for label, claim in made.items()]
    out("claims created over REST as tenant ml-team:")
    out(table(("CLAIM", "PRIO", "VCORE", "VMEM", "STATUS", "WHERE"), rows))
    return made


async def _release_and_replace(
    api: httpx.AsyncClient,
    tenant: dict[str, str],
    made: dict[str, dict[str, Any]],
    out: Callable[[str], None],
) -> None:
    """Delete the first T4 claim; the pending one is placed automatically."""
    waiting = made["second online on the T4"]
    if waiting["status"] != "pending":
        return
    out(f"pending: {waiting['reason']}")
    await api.delete(f"/v1/claims/{made['online on the T4']['id']}", headers=tenant)
    out("deleted 'online on the T4'; the allocator retries pending claims ...")
    async with asyncio.timeout(30):
        while waiting["status"] == "pending":
            await asyncio.sleep(0.1)
            waiting = (await api.get(f"/v1/claims/{waiting['id']}", headers=tenant)).json()
    out("  " + "  ".join(str(v) for v in _claim_row("second online on the T4", waiting)))


async def _gpu_table(api: httpx.AsyncClient) -> str:
    from qshare_api.cli import table

    rows = [
        (g["node"], g["index"], g["model"], f"{g['vgpus']}/{g['max_vgpus']}",
         format_mib(g["allocated_mib"]), format_mib(g["free_mib"]),
         f"{g['core_high_used']}%", f"{g['core_low_used']}%")
        for g in (await api.get("/v1/gpus")).json()
    ]  # fmt: skip
    headers = ("NODE", "IDX", "MODEL", "VGPUS", "ALLOCATED", "FREE", "HIGH_USED", "LOW_USED")
    return "cards after placement:\n" + table(headers, rows)


def _claim_row(label: str, claim: dict[str, Any]) -> tuple[str, ...]:
    cards = ",".join(f"{v['node']}/gpu{v['index']}" for v in claim["vgpus"]) or "-"
    return (label, claim["priority"], f"{claim['vcore']}%", format_mib(claim["vmemory_mib"]),
            claim["status"], cards)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(run_controlplane_demo())
