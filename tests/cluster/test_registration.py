"""A node agent keeps trying to register until an allocator's answer is one it can use: an
answer it cannot read (another version's, a broken one) is retried like no answer at all.
The agent here has a NATS server of its own, where the test answers its registrations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from nats.aio.msg import Msg

from qshare.contracts import subjects
from qshare.testing.servers import EmbeddedNats
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import eventually


async def test_an_unreadable_registration_answer_is_retried(tmp_path: Path) -> None:
    async with EmbeddedNats() as server:
        client = await nats.connect(server.url)
        asked: list[int] = []

        async def answer(msg: Msg) -> None:
            asked.append(1)
            await msg.respond(b'{"source": "allocator", "type": "t", "data": {"name": 1}}')

        await client.subscribe(subjects.NODE_REGISTRATIONS, cb=answer)
        await client.flush()
        settings = NodeAgentSettings(
            name="unanswered", nats_url=server.url, simulate="1:8Gi", shm_dir=tmp_path,
            heartbeat_s=0.5, keep_segment_on_stop=False, register_timeout_s=1,
        )  # fmt: skip
        agent = NodeAgent(settings)
        await agent.start()
        try:
            await eventually(lambda: _holds(len(asked) >= 2), 10)
        finally:
            await agent.stop()
            await client.close()


async def _holds(value: bool) -> bool:
    await asyncio.sleep(0)
    return value
