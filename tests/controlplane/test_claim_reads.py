"""The API reads a claim and its vGPUs in one snapshot: a move that commits between the two
statements does not show the claim with its old status and no vGPUs (it did, as `ready` with
an empty list, while a claim left an unhealthy card)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.rows import claim_views
from qshare.contracts.schema import claims, vgpus
from qshare.db import snapshot
from tests.controlplane.conftest import Claim, Register


async def test_a_claim_and_its_vgpus_are_read_as_one_commit_left_them(
    register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    await register("n1", cards=1)
    placed = await claim()
    reader = engine.execution_options(isolation_level="AUTOCOMMIT")  # as the API's
    async with snapshot(reader) as conn:
        row = (await conn.execute(select(claims).where(claims.c.id == placed.id))).one()
        async with engine.begin() as mover:  # what a move commits meanwhile
            await mover.execute(delete(vgpus).where(vgpus.c.claim_id == placed.id))
        [view] = await claim_views(conn, [row])
    assert (view.status, [v.gpu for v in view.vgpus]) == ("placed", ["n1-g0"])
