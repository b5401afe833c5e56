"""Nodes no agent registered (inventory for placement only): placing on them costs no read of
their desired state, since the placement itself reads, under the node's lock, that they have
no agent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qshare_allocator.app import Allocator
from qshare_allocator.nodes import dispatch
from tests.controlplane.conftest import Claim, Register


async def test_placements_on_a_node_without_agent_read_no_desired_state(
    register: Register, claim: Claim, replicas: list[Allocator], monkeypatch: pytest.MonkeyPatch
) -> None:
    await register("n1", cards=8, memory="80Gi")
    await asyncio.sleep(0.5)  # the registration's own apply round has read it by now
    reads: list[str] = []
    read = dispatch.desired_state

    async def counted(conn: Any, node: str) -> Any:
        reads.append(node)
        return await read(conn, node)

    monkeypatch.setattr(dispatch, "desired_state", counted)
    placed = await asyncio.gather(*(claim(vcore=10) for _ in range(16)))
    await asyncio.sleep(0.5)  # an apply round the placements started would have read by now
    assert {c.status for c in placed} == {"placed"}
    assert reads == []
