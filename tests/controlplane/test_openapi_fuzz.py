"""The OpenAPI document agrees with validation (issue 11, item 9): a schema-driven fuzz run
(schemathesis, every check) against the real API with real Postgres and NATS answers no
5xx and nothing the document does not describe. Bounded: a few hundred cases in all."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from qshare.natsauth import NatsAuth, ServiceRole
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, free_port
from qshare_allocator.app import Allocator
from qshare_allocator.migrate import upgrade
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from qshare_preemptor.app import Preemptor
from qshare_preemptor.settings import PreemptorSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, as_identity, auth, card

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES_PER_OPERATION = 12
SEED = 11


@pytest.fixture(scope="module")
async def api_url() -> AsyncIterator[str]:
    """A whole stack of its own: the fuzz run may revoke tokens and add classes."""
    identities = NatsAuth.generate()
    async with (
        EmbeddedPostgres(durable=False) as postgres,
        EmbeddedNats(config=identities.server_config()) as bus,
    ):
        await upgrade(postgres.url)
        common = {"database_url": postgres.url, "nats_url": bus.url, "cluster": RULES}
        allocator = AllocatorSettings(**common, **as_identity(identities, ServiceRole.ALLOCATOR))
        port = free_port()
        settings = ApiSettings(
            **common, port=port, bootstrap_admin_token=ADMIN_TOKEN,
            **as_identity(identities, ServiceRole.API),
        )  # fmt: skip
        preemptor = PreemptorSettings(
            database_url=postgres.url, nats_url=bus.url,
            **as_identity(identities, ServiceRole.PREEMPTOR),
        )  # fmt: skip
        async with Allocator(allocator), Preemptor(preemptor):
            server = uvicorn.Server(
                uvicorn.Config(create_app(settings), port=port, log_level="error")
            )
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
            server.should_exit = True
            await task


async def test_a_schema_driven_fuzz_run_finds_nothing(api_url: str, tmp_path: Path) -> None:
    node = {"name": "n1", "gpus": [card(f"n1-g{i}", i) for i in range(2)]}
    async with httpx.AsyncClient(base_url=api_url, headers=auth(ADMIN_TOKEN)) as http:
        assert (await http.post("/v1/nodes", json=node)).status_code == 200
    schemathesis = Path(sys.executable).parent / "schemathesis"
    process = await asyncio.create_subprocess_exec(
        str(schemathesis), "--config-file", str(CONFIG), "run", f"{api_url}/openapi.json",
        "--checks", "all", "--exclude-path", "/v1/events",  # a stream: tested in tests/cluster
        "--exclude-checks", "use_after_free",  # see schemathesis.toml
        "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", str(SEED),
        "--header", f"Authorization: Bearer {ADMIN_TOKEN}", "--generation-database", "none",
        "--no-color", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )  # fmt: skip
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()[-6000:]
