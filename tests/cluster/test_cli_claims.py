"""`qshare claims wait|suspend|resume` against the whole loop: the CLI as an operator uses
it, over a real HTTP port."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from qshare.cli import main

from .conftest import ADMIN_TOKEN, StartAgent, create_claim, ready_claim


async def qshare(api_url: str, *args: str) -> int:
    """The CLI in a thread (it is synchronous; the servers share this event loop), with the
    connection options after the verb, as people type them."""
    return await asyncio.to_thread(main, [*args, "--url", api_url, "--token", ADMIN_TOKEN])


async def test_wait_returns_once_the_claim_is_ready(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    await start_agent()
    claim = await create_claim(api)
    assert await qshare(api_url, "claims", "wait", claim["id"], "--timeout", "20") == 0
    assert " ready " in capsys.readouterr().out


async def test_wait_for_a_status_the_claim_cannot_reach_fails_at_once(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    await start_agent()
    claim = await ready_claim(api)
    await api.delete(f"/v1/claims/{claim['id']}")
    rc = await qshare(api_url, "claims", "wait", claim["id"], "--for", "ready", "--timeout", "60")
    assert rc == 1
    assert f"claim {claim['id']} is released" in capsys.readouterr().err


async def test_wait_names_the_pending_reason_when_it_times_out(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = await create_claim(api)  # no node: it stays pending
    assert await qshare(api_url, "claims", "wait", claim["id"], "--timeout", "0.5") == 1
    err = capsys.readouterr().err
    assert f"claim {claim['id']} is pending (" in err and "not ready" in err


async def test_a_wait_that_times_out_says_how_long_it_waited(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `is ready, not released` read as if the claim could never be released."""
    claim = await create_claim(api)  # no node: it stays pending
    assert await qshare(api_url, "claims", "wait", claim["id"], "--timeout", "0.5") == 1
    assert capsys.readouterr().err.rstrip().endswith("not ready, after waiting 0.5 s")


async def test_suspend_and_resume_act_on_the_claims_vgpus(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    agent = await start_agent()
    claim = await ready_claim(api)
    local_id = claim["vgpus"][0]["local_id"]
    assert await qshare(api_url, "claims", "suspend", claim["id"]) == 0
    assert agent.node.vgpu_stats(local_id).suspended
    assert await qshare(api_url, "claims", "resume", claim["id"]) == 0
    assert not agent.node.vgpu_stats(local_id).suspended
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"claim {claim['id']} suspended on 1 vGPU",
        f"claim {claim['id']} resumed on 1 vGPU",
    ]


async def test_wait_for_released_returns_once_the_deleted_claim_is_gone(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent
) -> None:
    await start_agent()
    claim = await ready_claim(api)
    await api.delete(f"/v1/claims/{claim['id']}")
    rc = await qshare(
        api_url, "claims", "wait", claim["id"], "--for", "released", "--timeout", "20"
    )
    assert rc == 0
    listed = (await api.get("/v1/claims", params={"status": "released"})).json()["items"]
    assert claim["id"] in [c["id"] for c in listed]


async def test_create_with_wait_returns_the_claim_once_it_is_ready(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    await start_agent()
    args = ("--priority", "low", "--vcore", "10", "--vmemory", "1Gi", "--wait", "20", "-o", "json")
    assert await qshare(api_url, "claims", "create", *args) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ready"


async def test_create_with_wait_that_times_out_says_the_claim_stays_and_how_to_delete_it(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--priority", "low", "--vcore", "10", "--vmemory", "1Gi", "--wait", "0.5")
    assert await qshare(api_url, "claims", "create", *args) == 1  # no node: it stays pending
    [claim] = (await api.get("/v1/claims")).json()["items"]
    err = capsys.readouterr().err
    assert f"the claim stays pending; `qshare claims delete {claim['id']}` withdraws it" in err


async def test_events_watch_prints_each_event_and_stops_after_count(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    await start_agent()
    args = ("--subject", "qshare.evt.claim.*.placed", "--count", "2", "-o", "json")
    watcher = asyncio.create_task(qshare(api_url, "events", "watch", *args))
    while not watcher.done():  # the stream subscribes once its request arrives: keep making events
        await create_claim(api)
        await asyncio.wait([watcher], timeout=0.3)
    assert watcher.result() == 0
    envelopes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["type"] for e in envelopes] == ["io.qshare.claim.placed"] * 2


async def test_events_watch_names_a_bad_subject(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await qshare(api_url, "events", "watch", "--subject", "not.ours") == 1
    assert "subject" in capsys.readouterr().err


async def test_a_bad_subject_gets_an_example_not_a_regular_expression(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await qshare(api_url, "events", "watch", "--subject", "claim.*.ready") == 1
    err = capsys.readouterr().err
    assert "'claim.*.ready' is not a subject under qshare.evt" in err
    assert "e.g. qshare.evt.claim.*.ready" in err and "^qshare" not in err


async def test_resize_changes_the_claims_size_per_card(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    await start_agent()
    claim = await ready_claim(api, vcore=20, vmemory="2Gi")
    rc = await qshare(api_url, "claims", "resize", claim["id"], "--vmemory", "3Gi", "-o", "json")
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["vmemory_mib"] == 3072


async def test_resize_without_a_size_is_a_usage_error(
    api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = await qshare(api_url, "claims", "resize", "00000000-0000-0000-0000-000000000001")
    assert rc == 2
    assert "--vcore, --vmemory or both" in capsys.readouterr().err


async def test_a_suspended_claim_says_so_in_get_and_list_until_it_is_resumed(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Before, `claims get` and `claims list` showed a suspended claim as plain `ready`."""
    await start_agent()
    claim = await ready_claim(api)
    assert await qshare(api_url, "claims", "suspend", claim["id"]) == 0
    [record] = (await api.get("/v1/preemptions", params={"claim": claim["id"]})).json()
    held = (await api.get(f"/v1/claims/{claim['id']}")).json()["suspended"]
    assert (held["kind"], held["preemption"], held["reason"]) == (
        "operator",
        record["id"],
        "operator",
    )
    capsys.readouterr()
    assert await qshare(api_url, "claims", "get", claim["id"]) == 0
    shown = capsys.readouterr().out
    assert shown.splitlines()[1].split()[2] == "ready,suspended"
    ends = f"by an operator ({held['by']}, operator): `qshare claims resume {claim['id']}` ends it"
    assert held["by"] and ends in shown
    assert await qshare(api_url, "claims", "list") == 0
    assert capsys.readouterr().out.splitlines()[1].split()[2] == "ready,suspended"
    assert await qshare(api_url, "claims", "get", claim["id"], "-o", "json") == 0
    assert json.loads(capsys.readouterr().out)["suspended"]["kind"] == "operator"
    assert await qshare(api_url, "claims", "resume", claim["id"]) == 0
    assert (await api.get(f"/v1/claims/{claim['id']}")).json()["suspended"] is None
    capsys.readouterr()
    assert await qshare(api_url, "claims", "list", "-o", "yaml") == 0
    assert "suspended: null" in capsys.readouterr().out
    assert await qshare(api_url, "claims", "get", claim["id"]) == 0
    shown = capsys.readouterr().out
    assert shown.splitlines()[1].split()[2] == "ready" and "suspended" not in shown
