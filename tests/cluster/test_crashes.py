"""Processes of the control plane killed with SIGKILL mid-flight: afterwards every claim
converges (ready on a node that holds its vGPUs) and nothing is lost or placed twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client as Nats
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.errors import QshareError
from qshare_allocator.audit import double_placements, overcommitted_cards
from qshare_preemptor.app import Preemptor

from .conftest import StartAgent, eventually, ready_claim


@contextlib.asynccontextmanager
async def service(module: str, env: dict[str, str], ready: bytes) -> AsyncIterator[Any]:
    """`python -m module`, ready once its log says `ready`; killed on exit if still alive."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, env=os.environ | env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    async with asyncio.timeout(60):
        while ready not in (line := await process.stderr.readline()):
            assert line, f"{module} exited before it was ready"
    drain = asyncio.create_task(process.stderr.read())
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        drain.cancel()


async def create_until_answered(nc: Nats, key: str) -> uuid.UUID:
    """A client that retries with the same idempotency key until a replica answers."""
    spec = ClaimSpec.model_validate(
        {"priority": "low", "vcore": 5, "vmemory": "1Gi", "idempotency_key": key}
    )
    while True:
        try:
            command = CreateClaim(tenant="crash", spec=spec)
            reply = await rpc.call(nc, subjects.CLAIMS_CREATE, "t", command, CreateClaimReply, 2)
            return reply.claim.id
        except QshareError:
            await asyncio.sleep(0.1)


async def statuses(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT status, count(*) FROM claims GROUP BY status"))
        return {r[0]: r[1] for r in rows}


async def test_claims_converge_after_an_allocator_replica_is_killed_mid_load(
    database_url: str, bus_url: str, nc: Nats, engine: AsyncEngine, start_agent: StartAgent
) -> None:
    await start_agent(cards=4, memory="64Gi")
    env = {"QSHARE_ALLOCATOR_DATABASE_URL": database_url, "QSHARE_ALLOCATOR_NATS_URL": bus_url,
           "QSHARE_ALLOCATOR_INSTANCE": "doomed", "QSHARE_NODE_TIMEOUT_S": "3"}  # fmt: skip
    async with service("qshare_allocator", env, b"serving") as doomed:
        creating = [asyncio.create_task(create_until_answered(nc, f"k{i}")) for i in range(40)]
        await asyncio.sleep(0.3)
        doomed.send_signal(signal.SIGKILL)
        ids = await asyncio.gather(*creating)
    assert len(set(ids)) == 40

    async def all_ready() -> bool:
        return await statuses(engine) == {"ready": 40}

    await eventually(all_ready, 60)
    async with engine.connect() as conn:
        assert (await overcommitted_cards(conn), await double_placements(conn)) == (0, 0)


async def test_a_restarted_preemptor_resumes_the_gangs_its_predecessor_left_suspended(
    api: Any, start_agent: StartAgent, preemptor: Preemptor, engine: AsyncEngine
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api, vcore=5, vmemory="1Gi")
    local_id = claim["vgpus"][0]["local_id"]
    agent.node.suspend(local_id)  # as a preemptor killed mid-episode left it
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO preemptions (claim_id, tenant, kind, reason) "
                 "VALUES (:c, 'admin', 'gang', 'left open')"), {"c": claim["id"]},
        )  # fmt: skip
    assert preemptor.service is not None
    await preemptor.service.reconcile()
    assert not agent.node.vgpu_stats(local_id).suspended


pytestmark = pytest.mark.timeout(180)


async def test_a_node_agent_killed_and_restarted_keeps_running_workloads_limited(
    api: Any, bus_url: str, tmp_path: Any, allocator: Any
) -> None:
    from qshare_driver import Client, OutOfMemoryError

    name = f"restarted-{os.getpid()}"
    args = {"QSHARE_NODE_NAME": name, "QSHARE_NODE_NATS_URL": bus_url,
            "QSHARE_NODE_SIMULATE": "1:8Gi", "QSHARE_NODE_SHM_DIR": str(tmp_path),
            "QSHARE_NODE_HEARTBEAT_S": "0.5"}  # fmt: skip
    # a class that keeps its claims where they are: a restart slower than the node timeout
    # (3 s here, on a loaded machine) degrades the claim instead of re-placing it
    stays = {"name": f"stays-{uuid.uuid4().hex[:8]}", "provisioner": "qshare",
             "replace_on_failure": False}  # fmt: skip
    assert (await api.post("/v1/classes", json=stays)).status_code == 201
    async with service("qshare_node_agent", args, b"node agent") as first:
        claim = await ready_claim(api, 30, vcore=10, class_name=stays["name"])
        vgpu = claim["vgpus"][0]
        client = Client.attach(f"qshare-{name}", vgpu["local_id"], tmp_path)
        client.reserve(1 << 30)
        first.send_signal(signal.SIGKILL)
        await first.wait()
    async with service("qshare_node_agent", args, b"node agent"):
        second = await ready_claim(api, 30, vcore=10)
        assert second["node"] == name
        with pytest.raises(OutOfMemoryError):
            client.reserve(2 << 30)
        client.reserve(512 << 20)
        client.detach()
    assert (await api.get(f"/v1/claims/{claim['id']}")).json()["status"] == "ready"
