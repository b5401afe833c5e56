"""The test and benchmark Postgres (`qshare.testing.servers.EmbeddedPostgres`) runs with every
setting it is given, those a reload applies and those only a restart does."""

from __future__ import annotations

from qshare.testing.servers import EmbeddedPostgres


def shown(server: EmbeddedPostgres, name: str) -> str:
    out = server.psql(f"SELECT 'value=' || current_setting('{name}');")
    return out.split("value=", 1)[1].split()[0]


async def test_a_setting_that_needs_a_restart_is_in_force() -> None:
    async with EmbeddedPostgres(durable=False, settings={"max_connections": "150"}) as server:
        assert shown(server, "max_connections") == "150"


async def test_a_setting_a_reload_applies_is_in_force() -> None:
    async with EmbeddedPostgres(settings={"autovacuum_naptime": "7"}) as server:
        assert shown(server, "autovacuum_naptime") == "7s"
