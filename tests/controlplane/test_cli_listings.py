# ruff: noqa: F811 (the fixture api_url, imported, is a parameter of the tests)
"""The CLI's read-only listings (preemptions, starvation, classes, the caller's quota) and
claim ids given by a prefix, resolved only among the caller's own claims."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.cli import main
from qshare.contracts.schema import claims, preemptions, starvations
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth
from tests.controlplane.test_cli import api_url  # noqa: F401 (the server these tests call)

Capsys = pytest.CaptureFixture[str]


async def _qshare(url: str, token: str, *args: str) -> int:
    group, *rest = args
    return await asyncio.to_thread(main, [group, "--url", url, "--token", token, *rest])


@pytest.fixture
async def tokens(api_url: str) -> dict[str, str]:
    """A token for each of two tenants, issued over the real server."""
    issued = {}
    async with httpx.AsyncClient(base_url=api_url, headers=auth(ADMIN_TOKEN)) as admin:
        for tenant in ("cli-a", "cli-b"):
            body = {"name": f"{tenant} cli", "tenant": tenant, "role": "tenant"}
            issued[tenant] = (await admin.post("/v1/tokens", json=body)).json()["token"]
    return issued


async def _claims(engine: AsyncEngine, tenant: str, *ids: str) -> None:
    """Pending claims of `tenant` with these ids, written straight into the database."""
    rows = [{"id": uuid.UUID(i), "tenant": tenant, "status": "pending", "priority": "low",
             "vcore": 10, "vmemory_mib": 1024, "count": 1, "class_name": "qshare"}
            for i in ids]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(claims), rows)


async def _preempted(engine: AsyncEngine, claim: str, *kinds: str) -> None:
    rows: list[dict[str, Any]] = [
        {"claim_id": uuid.UUID(claim), "tenant": "cli-a", "kind": k, "reason": f"{k} test"}
        for k in kinds
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(preemptions), rows)


async def test_a_claim_is_found_by_its_first_8_hex_digits(
    api_url: str,
    register: Register,
    capsys: Capsys,
) -> None:
    await register("n1")
    args = ("--priority", "high", "--vcore", "30", "--vmemory", "2Gi", "-o", "json")
    assert await _qshare(api_url, ADMIN_TOKEN, "claims", "create", *args) == 0
    claim_id = capsys.readouterr().out.split('"id": "')[1][:36]
    assert await _qshare(api_url, ADMIN_TOKEN, "claims", "get", f"{claim_id[:8]}…") == 0
    assert claim_id in capsys.readouterr().out


async def test_a_prefix_of_several_claims_is_refused_naming_them(
    api_url: str,
    engine: AsyncEngine,
    tokens: dict[str, str],
    capsys: Capsys,
) -> None:
    both = ("abcdef01-0000-4000-8000-000000000001", "abcdef01-0000-4000-8000-000000000002")
    await _claims(engine, "cli-a", *both)
    assert await _qshare(api_url, tokens["cli-a"], "claims", "get", "abcdef01") == 2
    err = capsys.readouterr().err
    assert "several claims" in err
    assert all(claim in err for claim in both)


async def test_a_tenant_never_resolves_another_tenants_claim(
    api_url: str,
    engine: AsyncEngine,
    tokens: dict[str, str],
    capsys: Capsys,
) -> None:
    await _claims(engine, "cli-a", "abcdef02-0000-4000-8000-000000000001")
    assert await _qshare(api_url, tokens["cli-b"], "claims", "delete", "abcdef02") == 2
    assert "no claim of yours starts with abcdef02" in capsys.readouterr().err


def test_a_claim_prefix_shorter_than_8_digits_is_refused(capsys: Capsys) -> None:
    with pytest.raises(SystemExit):
        main(["claims", "--token", "t", "get", "abcd"])
    assert "first 8 hex digits" in capsys.readouterr().err


async def test_preemptions_list_filters_by_claim_prefix_and_kind(
    api_url: str,
    engine: AsyncEngine,
    tokens: dict[str, str],
    capsys: Capsys,
) -> None:
    claim = "abcdef03-0000-4000-8000-000000000001"
    await _claims(engine, "cli-a", claim)
    await _preempted(engine, claim, "gang", "eviction")
    args = ("list", "--claim", "abcdef03", "--kind", "eviction")
    assert await _qshare(api_url, tokens["cli-a"], "preemptions", *args) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["ID", "CLAIM", "TENANT", "KIND"]
    assert [row.split()[1:4] for row in rows] == [[claim, "cli-a", "eviction"]]


def test_preemptions_of_an_unknown_kind_are_refused_naming_kind(capsys: Capsys) -> None:
    with pytest.raises(SystemExit):
        main(["preemptions", "--token", "t", "list", "--kind", "nap"])
    assert "--kind" in capsys.readouterr().err


async def test_starvation_list_shows_shares_as_percentages(
    api_url: str,
    engine: AsyncEngine,
    capsys: Capsys,
) -> None:
    claim = uuid.uuid4()
    row = {"claim_id": claim, "tenant": "cli-a", "gpu_uuid": "n1-g0", "node_name": "n1",
           "share": 0.02, "harvestable_share": 0.05, "window_s": 10.0}  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(starvations).values(row))
    args = ("list", "--claim", str(claim))
    assert await _qshare(api_url, ADMIN_TOKEN, "starvation", *args) == 0
    _, line = capsys.readouterr().out.splitlines()
    assert line.split()[1:8] == [str(claim), "cli-a", "n1", "n1-g0", "2%", "5%", "yes"]


async def test_classes_list_shows_the_builtin_classes(api_url: str, capsys: Capsys) -> None:
    assert await _qshare(api_url, ADMIN_TOKEN, "classes", "list") == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert {"qshare", "whole"} <= set(names)


async def test_quotas_show_gives_a_tenant_its_limits_and_usage(
    api_url: str,
    engine: AsyncEngine,
    tokens: dict[str, str],
    capsys: Capsys,
) -> None:
    await _claims(engine, "cli-a", str(uuid.uuid4()))
    assert await _qshare(api_url, ADMIN_TOKEN, "quotas", "set", "cli-a", "--cards", "3") == 0
    capsys.readouterr()
    assert await _qshare(api_url, tokens["cli-a"], "quotas", "show") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tenant cli-a")
    assert [line.split() for line in lines[2:]] == [
        ["memory", "1", "GiB", "-"], ["cards", "1", "3"], ["pending", "1", "-"]
    ]  # fmt: skip


async def test_quotas_show_refuses_a_tenant_another_tenants_quota(
    api_url: str,
    tokens: dict[str, str],
    capsys: Capsys,
) -> None:
    assert await _qshare(api_url, tokens["cli-a"], "quotas", "show", "--tenant", "cli-b") == 1
    assert "error 403" in capsys.readouterr().err


async def test_a_create_refused_for_quota_points_to_quotas_show(
    api_url: str, tokens: dict[str, str], capsys: Capsys
) -> None:
    assert await _qshare(api_url, ADMIN_TOKEN, "quotas", "set", "cli-b", "--cards", "0") == 0
    args = ("create", "--priority", "low", "--vcore", "10", "--vmemory", "1Gi")
    assert await _qshare(api_url, tokens["cli-b"], "claims", *args) == 1
    assert "`qshare quotas show`" in capsys.readouterr().err


async def test_a_claim_option_that_matches_nothing_is_named(
    api_url: str, tokens: dict[str, str], capsys: Capsys
) -> None:
    args = ("list", "--claim", "abcdef04...")
    assert await _qshare(api_url, tokens["cli-a"], "preemptions", *args) == 2
    assert "--claim: no claim of yours starts with abcdef04" in capsys.readouterr().err


async def test_claims_list_tenant_gives_an_admin_one_tenants_claims(
    api_url: str, engine: AsyncEngine, capsys: Capsys
) -> None:
    await _claims(engine, "cli-a", "abcdef05-0000-4000-8000-000000000001")
    await _claims(engine, "cli-b", "abcdef06-0000-4000-8000-000000000001")
    capsys.readouterr()
    assert await _qshare(api_url, ADMIN_TOKEN, "claims", "list", "--tenant", "cli-b") == 0
    listed = capsys.readouterr().out
    assert ("abcdef06" in listed, "abcdef05" in listed) == (True, False)


async def test_claims_list_tenant_refuses_a_tenant_another_tenants_claims(
    api_url: str, tokens: dict[str, str], capsys: Capsys
) -> None:
    assert await _qshare(api_url, tokens["cli-a"], "claims", "list", "--tenant", "cli-b") == 1
    assert "only admins may list another tenant's claims" in capsys.readouterr().err
