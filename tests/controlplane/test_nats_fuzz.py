"""Every request subject the allocator and the preemptor serve, fed a valid message with one
field at a time turned hostile (gone, null, wrong type, huge, NUL, NaN, ...), answers each
with a reply or an error naming the problem — never an internal error, never silence — and
both services go on serving. The NATS side of what `test_openapi_fuzz.py` asks of REST."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import envelope, subjects
from qshare.contracts.agent import ApplyReply
from qshare.contracts.errors import ERROR_CODE_HEADER
from qshare.natsauth import NatsAuth, ServiceRole
from qshare_allocator.app import Allocator
from qshare_allocator.db import in_transaction
from qshare_allocator.nodes.confirm import Confirmations
from qshare_preemptor.app import Preemptor
from qshare_preemptor.settings import PreemptorSettings
from tests.controlplane.conftest import Claim, Register, as_identity
from tests.controlplane.hostile import variants


def _body(data: Any) -> bytes:
    """An envelope around `data`, as `envelope.encode` writes one (NaN and Infinity as
    Python's json writes them: a sender may)."""
    return json.dumps({"source": "fuzz", "type": "fuzz", "data": data}).encode()


async def _answer(nc: Client, subject: str, data: Any) -> str | None:
    """The reply's error code, None for a successful reply; 'silence' when none came."""
    try:
        reply = await nc.request(subject, _body(data), timeout=10)
    except NatsTimeout:
        return "silence"
    headers = reply.headers or {}
    return headers.get(ERROR_CODE_HEADER)


async def _bad_answers(nc: Client, subject: str, seed: dict[str, Any]) -> list[str]:
    """The mutations of `seed` on `subject` answered with an internal error or not at all."""
    bad = []
    for what, data in variants(seed):
        code = await _answer(nc, subject, data)
        if code in ("500", "silence"):
            bad.append(f"{subject}: {what}: {code}")
    return bad


@pytest.fixture
async def preemptor(
    database_url: str, bus_url: str, nats_auth: NatsAuth, replicas: list[Allocator]
) -> AsyncIterator[Preemptor]:
    settings = PreemptorSettings(
        database_url=database_url, nats_url=bus_url,
        **as_identity(nats_auth, ServiceRole.PREEMPTOR),
    )  # fmt: skip
    async with Preemptor(settings) as running:
        yield running


@pytest.fixture
async def held(register: Register, claim: Claim) -> str:
    """A node `fz` with two cards, and a low-priority claim placed there: its id."""
    await register("fz", cards=2)
    return str((await claim(priority="low", vcore=10, vmemory="1Gi")).id)


def _spec() -> dict[str, Any]:
    return {
        "priority": "low", "vcore": 10, "vmemory": "1Gi", "count": 1, "class_name": "qshare",
        "node_selector": {"zone": "a"}, "placement": {"node": "binpack", "card": "spread"},
        "idempotency_key": "fuzz", "gang": "fuzz",
    }  # fmt: skip


def _heartbeat() -> dict[str, Any]:
    """A heartbeat (an event, answered when it asks for a reply) reporting card fz-g0."""
    sharing = {"gpu": "fz-g0", "policy": "best-effort", "release_mode": "auto",
               "release_delay_s": 0.1, "release_auto_bound_s": 0.01, "lp_window_s": 0.0005,
               "lp_device_gate": True, "timeslice": "short",
               "timeslice_refused": "medium: not root"}  # fmt: skip
    return {"unhealthy": ["fz-g1"], "sharing": [sharing]}


def _registration(name: str) -> dict[str, Any]:
    cards = [{"uuid": f"{name}-g0", "index": 0, "model": "A100", "memory": "16Gi",
              "healthy": True}]  # fmt: skip
    return {"name": name, "labels": {"zone": "a"}, "gpus": cards, "segment": "qs-fuzz",
            "shm_dir": "/dev/shm"}  # fmt: skip


def _claim_seeds(claim_id: str) -> list[tuple[str, dict[str, Any]]]:
    sharing = {"policy": "fixed-share", "release_mode": "fixed", "release_delay_s": 0.1,
               "lp_window_s": 0.0005, "lp_device_gate": False}  # fmt: skip
    resize = {"claim_id": claim_id, "tenant": "team-a", "change": {"vcore": 20, "vmemory": "2Gi"}}
    move = {"claim_id": claim_id, "from_gpu": "fz-g0", "to_gpus": ["fz-g1"], "reason": "starved"}
    return [
        (subjects.CLAIMS_CREATE, {"tenant": "team-a", "spec": _spec()}),
        (subjects.PLACEMENT_PREVIEW, {"spec": _spec(), "nodes": ["fz", "nowhere"]}),
        (subjects.CLAIMS_RESIZE, resize),
        (subjects.CLAIMS_MOVE, move),
        (subjects.GPUS_SHARING, {"uuid": "fz-g0", "change": sharing}),
        (subjects.NODES_UPDATE, {"name": "fz", "change": {"schedulable": True}}),
        (subjects.heartbeat("fz"), _heartbeat()),
        (subjects.CLAIMS_SUSPEND, {"claim_id": claim_id, "tenant": "team-a", "reason": "fuzz"}),
        (subjects.CLAIMS_RESUME, {"claim_id": claim_id, "tenant": None, "reason": "fuzz"}),
    ]


def _inventory_seeds() -> list[tuple[str, dict[str, Any]]]:
    """Seeds that add or remove inventory: run after the claim's, on other names."""
    return [
        (subjects.NODES_REGISTER, _registration("fz-other")),
        (subjects.node_register("fz-own"), _registration("fz-own")),
        (subjects.GPUS_DELETE, {"node": "fz-gone", "uuid": "fz-gone-g0"}),
        (subjects.NODES_DELETE, {"name": "fz-gone"}),
        (subjects.CLAIMS_DELETE, {"claim_id": str(uuid.uuid4()), "tenant": "team-a"}),
    ]


async def test_hostile_fields_in_claim_requests_get_an_answer_and_never_an_internal_error(
    nc: Client, held: str, preemptor: Preemptor
) -> None:
    bad = []
    for subject, seed in _claim_seeds(held):
        bad += await _bad_answers(nc, subject, seed)
    assert bad == [], "\n".join(bad)


async def test_hostile_fields_in_inventory_requests_get_an_answer_and_never_an_internal_error(
    nc: Client, replicas: list[Allocator]
) -> None:
    bad = []
    for subject, seed in _inventory_seeds():
        bad += await _bad_answers(nc, subject, seed)
    assert bad == [], "\n".join(bad)


async def test_both_services_still_serve_after_the_hostile_requests(
    nc: Client, held: str, preemptor: Preemptor, claim: Claim
) -> None:
    for subject, seed in _claim_seeds(held)[:1] + _claim_seeds(held)[-2:]:
        await _bad_answers(nc, subject, seed)
    assert (await claim(priority="low")).status == "placed"
    assert await _answer(nc, subjects.CLAIMS_SUSPEND, {"claim_id": held}) is None


async def _local_id(engine: AsyncEngine, claim_id: str) -> int:
    async def read(conn: AsyncConnection) -> int:
        query = text("SELECT local_id FROM vgpus WHERE claim_id = :id")
        return int((await conn.execute(query, {"id": claim_id})).scalar_one())

    return await in_transaction(engine, read)


async def test_hostile_fields_in_a_usage_report_are_refused_or_judged_never_failed(
    engine: AsyncEngine, held: str, preemptor: Preemptor, caplog: pytest.LogCaptureFixture
) -> None:
    """With Postgres and NATS up, a report the watch could neither refuse nor judge (its
    catch-all, meant for outages) is a bug."""
    assert preemptor.starvation is not None
    vgpu = {"local_id": await _local_id(engine, held), "device_ns": 10**8}
    seed = {"node": "fz", "interval_ns": 10**9,
            "cards": [{"gpu": "fz-g0", "hp_ns": 10**8, "vgpus": [vgpu]}]}  # fmt: skip
    caplog.set_level(logging.WARNING, logger="qshare_preemptor.starvation")
    for _, data in variants(seed):
        await preemptor.starvation.usage(subjects.usage("fz"), _body(data))
    assert [r.getMessage() for r in caplog.records if "not judged" in r.getMessage()] == []
    assert preemptor.starvation.taken > 0  # the valid ones went past the edge


@pytest.mark.parametrize("gpu", ["\x00", "é" * 300, "x" * 5000, "fz-g0\x00"])
async def test_a_card_event_naming_a_hostile_card_is_ignored_not_failed(
    held: str, preemptor: Preemptor, gpu: str
) -> None:
    """A card token in an event's subject is whatever its node published."""
    assert preemptor.service is not None
    await preemptor.service.card_event("fz", gpu, busy=True)


@pytest.mark.parametrize("token", ["\x00", "fz\x00", "é" * 300, "fz-"])
@pytest.mark.parametrize("verb", ["heartbeat", "register"])
async def test_a_node_subject_naming_a_hostile_node_gets_an_answer_not_an_internal_error(
    nc: Client, held: str, token: str, verb: str
) -> None:
    """The node token of `qshare.node.<node>.…` is whatever its publisher chose (within
    NATS's own limit on a subject's length, past which the server drops the connection)."""
    data = _heartbeat() if verb == "heartbeat" else _registration("fz")
    assert await _answer(nc, f"qshare.node.{token}.{verb}", data) not in ("500", "silence")


def _apply_reply(generation: int, local_id: int) -> dict[str, Any]:
    """An agent's answer to `cmd.apply` on node fz: the claim's vGPU applied, another refused,
    and how its cards are shared."""
    return {"node": "fz", "generation": generation, "applied": [local_id],
            "refused": [{"local_id": local_id + 1, "reason": "no room"}], "stale": False,
            "sharing": _heartbeat()["sharing"],
            "sharing_refused": [{"gpu": "fz-g0", "reason": "not root"}]}  # fmt: skip


async def _desired_generation(engine: AsyncEngine) -> int:
    async def read(conn: AsyncConnection) -> int:
        query = text("SELECT desired_generation FROM nodes WHERE name = 'fz'")
        return int((await conn.execute(query)).scalar_one())

    return await in_transaction(engine, read)


async def test_hostile_fields_in_an_apply_reply_are_refused_or_recorded_never_failed(
    engine: AsyncEngine, held: str
) -> None:
    """A reply the dispatcher's `rpc.call` accepts is confirmed in Postgres without an error:
    one that failed there would fail on every retry, and that node's claims with it."""
    seed = _apply_reply(await _desired_generation(engine), await _local_id(engine, held))
    confirmations = Confirmations("fuzz")
    failed = []
    for what, data in variants(seed):
        try:
            reply = envelope.decode(_body(data)).payload(ApplyReply)
        except ValidationError:
            continue  # refused at the edge: rpc.call raises, the node is asked again later
        try:
            await in_transaction(engine, partial(confirmations.confirm, reply=reply))
        except Exception as error:  # every failure is the finding
            failed.append(f"{what}: {error!r:.160}")
    assert failed == []
