"""`qshare preemptions list` shows who suspended each claim (BY), and `qshare claims
suspend|resume --reason` checks its reason before anything is sent."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.cli import main
from qshare.contracts.schema import preemptions

from .test_cli import _qshare, api_url

__all__ = ["api_url"]  # the module's API server, as a fixture


async def test_the_preemption_list_names_who_suspended_each_claim(
    api_url: str, engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    claim, by = uuid.uuid4(), "ops-alice (token 5b0c2f1e-0000-4000-8000-000000000001)"
    rows = [
        {"claim_id": claim, "tenant": "t-a", "kind": "operator", "reason": "r", "suspended_by": by},
        {
            "claim_id": claim,
            "tenant": "t-a",
            "kind": "gang",
            "reason": "busy",
            "suspended_by": None,
        },
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(preemptions), rows)
    assert await _qshare(api_url, "preemptions", "list", "--claim", str(claim)) == 0
    header, gang, operator = capsys.readouterr().out.splitlines()
    assert header.split()[-2:] == ["BY", "REASON"]
    assert by in operator and " - " in gang


@pytest.mark.parametrize("reason", ["x" * 254, "a\x00b"])
def test_a_reason_the_api_would_refuse_is_refused_before_sending(
    reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = str(uuid.uuid4())
    argv = ["claims", "--url", "http://127.0.0.1:9", "--token", "t", "suspend", claim]
    with pytest.raises(SystemExit) as usage:
        main([*argv, "--reason", reason])
    assert usage.value.code == 2 and "--reason" in capsys.readouterr().err
