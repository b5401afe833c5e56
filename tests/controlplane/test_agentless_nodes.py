"""Nodes no agent registered (inventory for placement only): placing on them costs no read of
their desired state, since the placement itself reads, under the node's lock, that they have
no agent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qshare_allocator.app import Allocator
from qshare_allocator.nodes import dispatch
from tests.controlplane.conftest import Claim, Register, eventually


async def test_placements_on_a_node_without_agent_read_no_desired_state(
    register: Register, claim: Claim, replicas: list[Allocator], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    read = dispatch.desired_state

    async def counted(conn: Any, node: str) -> Any:
        found = await read(conn, node)
        reads.append(node)
        return found

    monkeypatch.setattr(dispatch, "desired_state", counted)
    await register("n1", cards=8, memory="80Gi")

    async def registration_read() -> bool:
        return reads == ["n1"]

    # the registration's own apply round reads it once, whenever its task gets to run (after
    # the registration's answer, so not within a fixed time on a loaded machine)
    await eventually(registration_read, 20)
    reads.clear()
    placed = await asyncio.gather(*(claim(vcore=10) for _ in range(16)))
    await asyncio.sleep(0.5)  # an apply round the placements started would have read by now
    assert {c.status for c in placed} == {"placed"}
    assert reads == []
