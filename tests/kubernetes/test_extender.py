"""The scheduler extender: filter, prioritize and bind with the scheduler's JSON types,
placing through the real allocator (Postgres, NATS) and annotating pods through the API
server double."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest
from fastapi import FastAPI
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.nodes import NodeRegistration, NodeView
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.testing.inventory import empty_tables
from qshare_allocator.app import Allocator
from qshare_api.app import create_app
from qshare_api.extender.kube import Kube
from qshare_api.extender.reaper import Reaper
from qshare_api.extender.settings import ExtenderSettings
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import RULES, as_identity

from .doubles import ApiServerDouble

HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(autouse=True)
async def empty_inventory(engine: AsyncEngine) -> None:
    """Every test starts with no nodes and no claims."""

    await empty_tables(engine, ("nodes", "gpus", "claims", "vgpus", "outbox"))


@pytest.fixture
async def extender_app(
    database_url: str,
    bus_url: str,
    replicas: list[Allocator],
    apiserver: ApiServerDouble,
    nats_auth: NatsAuth,
) -> AsyncIterator[FastAPI]:
    ext = ExtenderSettings(
        enabled=True, api_server=apiserver.url, token_file=None, ca_file=None, reap_s=3600,
        vmemory_unit_mib=1,  # the pods below ask MiB
    )  # fmt: skip
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, cluster=RULES, extender=ext,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def extender(extender_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=extender_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://qshare.test") as client:
        yield client


async def register(nc: Client, name: str, cards: int = 1, memory: str = "16Gi") -> NodeView:
    gpus = [
        {"uuid": f"{name}-g{i}", "index": i, "model": "A100", "memory": memory}
        for i in range(cards)
    ]
    body = {"name": name, "labels": {HOSTNAME: name}, "gpus": gpus}
    registration = NodeRegistration.model_validate(body)
    return await rpc.call(nc, subjects.NODES_REGISTER, "test", registration, NodeView)


def pod(
    name: str = "infer", vcore: Any = 50, vmemory: Any = 8192, priority: str = "high"
) -> dict[str, Any]:
    limits = (
        {} if vcore is None else {"qshare.io/vcore": str(vcore), "qshare.io/vmemory": str(vmemory)}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": str(uuid.uuid4()),
            "annotations": {"qshare.io/priority": priority},
        },
        "spec": {"containers": [{"name": "main", "image": "img", "resources": {"limits": limits}}]},
    }


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "NodeNames": names}


async def test_filter_keeps_nodes_where_the_pod_fits_and_says_why_others_do_not(
    extender: httpx.AsyncClient, nc: Client
) -> None:
    await register(nc, "node-a", memory="16Gi")
    await register(nc, "node-b", memory="4Gi")
    reply = await extender.post("/extender/filter", json=args(pod(), ["node-a", "node-b", "ghost"]))
    body = reply.json()
    assert body["NodeNames"] == ["node-a"]
    assert "no capacity" in body["FailedNodes"]["node-b"]
    assert "not a qshare node" in body["FailedNodes"]["ghost"]
    assert body.get("Error", "") == ""


async def test_filter_answers_with_node_objects_when_given_node_objects(
    extender: httpx.AsyncClient, nc: Client
) -> None:
    await register(nc, "node-a")
    nodes = {"items": [{"metadata": {"name": "node-a"}}, {"metadata": {"name": "node-z"}}]}
    reply = await extender.post("/extender/filter", json={"pod": pod(), "nodes": nodes})
    assert [n["metadata"]["name"] for n in reply.json()["Nodes"]["items"]] == ["node-a"]


async def test_a_pod_that_asks_nothing_of_qshare_passes_every_node(
    extender: httpx.AsyncClient,
) -> None:
    reply = await extender.post("/extender/filter", json=args(pod(vcore=None), ["x", "y"]))
    assert reply.json()["NodeNames"] == ["x", "y"]


@pytest.mark.parametrize(
    ("vcore", "vmemory", "message"),
    [
        (101, 4096, "qshare.io/vcore: Input should be less than or equal to 100"),
        (0, 4096, "qshare.io/vcore: Input should be greater than or equal to 1"),
        (10, "lots", "must be whole numbers"),
        (10, 512, "vmemory: must be at least 1 GiB"),
    ],
)
async def test_a_bad_pod_request_gets_an_error_naming_what_is_wrong(
    extender: httpx.AsyncClient, nc: Client, vcore: Any, vmemory: Any, message: str
) -> None:
    await register(nc, "node-a")
    reply = await extender.post(
        "/extender/filter", json=args(pod(vcore=vcore, vmemory=vmemory), ["node-a"])
    )
    assert reply.status_code == 200
    assert message in reply.json()["Error"]


async def test_a_pod_of_the_wrong_shape_gets_an_error_not_a_crash(
    extender: httpx.AsyncClient,
) -> None:
    odd = {"metadata": {"name": "odd"}, "spec": {"containers": "main"}}
    reply = await extender.post("/extender/filter", json=args(odd, ["node-a"]))
    assert reply.status_code == 200
    assert reply.json()["Error"] == "pod.spec.containers must be a list of containers"


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_a_pod_whose_metadata_is_not_an_object_gets_an_error_not_a_crash(
    extender: httpx.AsyncClient, verb: str
) -> None:
    odd = dict(pod(), metadata="infer")
    reply = await extender.post(f"/extender/{verb}", json=args(odd, ["node-a"]))
    assert reply.status_code == 200
    if verb == "filter":
        assert reply.json()["Error"] == "pod.metadata must be an object"
    else:
        assert reply.json() == [{"Host": "node-a", "Score": 0}]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_more_candidate_nodes_than_a_preview_takes_get_an_error_not_a_crash(
    extender: httpx.AsyncClient, verb: str
) -> None:
    reply = await extender.post(f"/extender/{verb}", json=args(pod(), ["n"] * 10_001))
    assert reply.status_code == 200
    if verb == "filter":
        assert reply.json()["Error"] == "at most 10000 candidate nodes, got 10001"
    else:
        assert {h["Score"] for h in reply.json()} == {0}


async def test_a_candidate_node_name_with_a_nul_gets_an_error_naming_it_not_a_crash(
    extender: httpx.AsyncClient,
) -> None:
    reply = await extender.post("/extender/filter", json=args(pod(), ["node-a", "bad\x00"]))
    assert reply.status_code == 200
    assert reply.json()["Error"].startswith("candidate nodes.1: String should match pattern")


async def test_node_objects_without_a_name_get_a_problem_document(
    extender: httpx.AsyncClient,
) -> None:
    body = {"Pod": pod(), "Nodes": {"items": [{"metadata": {}}]}}
    reply = await extender.post("/extender/filter", json=body)
    assert reply.status_code == 422
    assert "name" in reply.text


async def test_malformed_extender_args_get_a_problem_document_not_a_crash(
    extender: httpx.AsyncClient,
) -> None:
    reply = await extender.post("/extender/filter", json={"NodeNames": "node-a"})
    assert reply.status_code == 422
    assert reply.headers["content-type"].startswith("application/problem+json")


def stored_pod(apiserver: ApiServerDouble, name: str, node: str, **kw: Any) -> dict[str, Any]:
    """Store a pod in the API server double; return the scheduler's binding args for it."""
    p = pod(name, **kw)
    apiserver.put_object(f"/api/v1/namespaces/team-a/pods/{name}", p)
    return {"PodName": name, "PodNamespace": "team-a", "PodUID": p["metadata"]["uid"], "Node": node}


async def claims_of(engine: AsyncEngine) -> list[tuple[str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT status, node_name FROM claims ORDER BY created_at"))
        return [(r.status, r.node_name) for r in rows]


async def test_prioritize_scores_the_freer_node_higher_under_spread(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble
) -> None:
    await register(nc, "node-a")
    await register(nc, "node-b")
    busy = await extender.post("/extender/bind", json=stored_pod(apiserver, "first", "node-b"))
    assert busy.json().get("Error", "") == ""
    reply = await extender.post(
        "/extender/prioritize", json=args(pod("next"), ["node-a", "node-b"])
    )
    scores = {h["Host"]: h["Score"] for h in reply.json()}
    assert scores["node-a"] == 10 > scores["node-b"]


async def test_a_node_named_twice_is_scored_as_if_named_once(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble
) -> None:
    await register(nc, "node-a", cards=2)
    busy = await extender.post("/extender/bind", json=stored_pod(apiserver, "first", "node-a"))
    assert busy.json().get("Error", "") == ""
    once = await extender.post("/extender/prioritize", json=args(pod("x"), ["node-a"]))
    twice = await extender.post("/extender/prioritize", json=args(pod("y"), ["node-a", "node-a"]))
    assert [h["Score"] for h in twice.json()] == [once.json()[0]["Score"]] * 2


async def test_bind_creates_the_claim_on_the_node_annotates_and_binds_the_pod(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a", cards=2)
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "web", "node-a"))
    assert reply.json().get("Error", "") == ""
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web"]
    assert stored["spec"]["nodeName"] == "node-a"
    [vgpu] = json.loads(stored["metadata"]["annotations"]["qshare.io/vgpus"])
    assert (vgpu["node"], vgpu["vcore"], vgpu["vmemory_mib"], vgpu["priority"]) == (
        "node-a",
        50,
        8192,
        "high",
    )
    assert await claims_of(engine) == [("placed", "node-a")]


async def test_a_repeated_bind_of_the_same_pod_keeps_one_claim(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web", "node-a")
    for _ in range(2):
        reply = await extender.post("/extender/bind", json=binding)
        assert reply.json().get("Error", "") == ""
    assert await claims_of(engine) == [("placed", "node-a")]


async def test_a_bind_that_no_longer_fits_fails_and_leaves_no_claim(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a", memory="4Gi")
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "big", "node-a"))
    error = reply.json()["Error"]
    assert "no longer fits on node node-a" in error or "more than any card" in error
    assert "spec" not in apiserver.objects["/api/v1/namespaces/team-a/pods/big"] or (
        "nodeName" not in apiserver.objects["/api/v1/namespaces/team-a/pods/big"]["spec"]
    )
    assert [s for s, _ in await claims_of(engine) if s in ("placed", "pending")] == []


async def test_a_bind_for_a_pod_the_api_server_does_not_have_fails_clearly(
    extender: httpx.AsyncClient, nc: Client
) -> None:
    await register(nc, "node-a")
    binding = {"PodName": "nope", "PodNamespace": "team-a", "PodUID": "u", "Node": "node-a"}
    reply = await extender.post("/extender/bind", json=binding)
    assert "pod team-a/nope" in reply.json()["Error"]
    assert "404" in reply.json()["Error"]


async def test_the_claim_of_a_finished_or_deleted_pod_is_given_back(
    extender: httpx.AsyncClient,
    extender_app: FastAPI,
    nc: Client,
    apiserver: ApiServerDouble,
    engine: AsyncEngine,
) -> None:
    await register(nc, "node-a", cards=2)
    for name in ("done", "gone", "running"):
        reply = await extender.post("/extender/bind", json=stored_pod(apiserver, name, "node-a"))
        assert reply.json().get("Error", "") == ""
    reaper = Reaper(extender_app.state.resources)
    assert await reaper.sweep() == []
    apiserver.objects["/api/v1/namespaces/team-a/pods/done"]["status"] = {"phase": "Succeeded"}
    del apiserver.objects["/api/v1/namespaces/team-a/pods/gone"]
    assert len(await reaper.sweep()) == 2
    statuses = sorted(s for s, _ in await claims_of(engine))
    assert statuses == ["placed", "released", "released"]


def test_binds_and_sweeps_share_one_tls_context_per_ca_file(tmp_path: Path) -> None:
    """Building a TLS context costs tens of ms on the event loop that serves filter and
    prioritize: it is built once per CA file, not once per bind or sweep."""
    ca = tmp_path / "ca.crt"
    shutil.copy(certifi.where(), ca)
    ext = ExtenderSettings(enabled=True, token_file=None, ca_file=ca)
    assert Kube(ext).tls is Kube(ext).tls
    assert Kube(ext.model_copy(update={"ca_file": None})).tls is not Kube(ext).tls


def test_a_rotated_ca_file_is_read_again(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    shutil.copy(certifi.where(), ca)
    ext = ExtenderSettings(enabled=True, token_file=None, ca_file=ca)
    before = Kube(ext).tls
    os.utime(ca, ns=(ca.stat().st_atime_ns, ca.stat().st_mtime_ns + 1_000_000_000))
    assert Kube(ext).tls is not before


def recreate(apiserver: ApiServerDouble, name: str) -> str:
    """Delete the stored pod and create another under its name (as a StatefulSet does);
    returns the new instance's uid."""
    path = f"/api/v1/namespaces/team-a/pods/{name}"
    apiserver.delete_object(path)
    fresh = pod(name)
    apiserver.put_object(path, fresh)
    return str(fresh["metadata"]["uid"])


async def test_bind_of_a_pod_re_created_since_scheduling_writes_nothing_and_keeps_no_claim(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    recreate(apiserver, "web-0")
    reply = await extender.post("/extender/bind", json=binding)
    assert "was re-created" in reply.json()["Error"]
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]
    assert "qshare.io/claim" not in stored["metadata"]["annotations"]
    assert "nodeName" not in stored["spec"]
    assert await claims_of(engine) == []


async def test_a_pod_re_created_before_its_annotation_is_not_annotated_and_its_claim_is_given_back(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.before_patch = lambda path: recreate(apiserver, "web-0")
    reply = await extender.post("/extender/bind", json=binding)
    apiserver.before_patch = None
    error = reply.json()["Error"]
    assert "pod team-a/web-0: was deleted or re-created under its name before it was annotated" in (
        error
    )
    assert "field is immutable" in error
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]
    assert stored["metadata"]["uid"] != binding["PodUID"]
    assert "qshare.io/claim" not in stored["metadata"]["annotations"]
    assert "nodeName" not in stored["spec"]
    assert [s for s, _ in await claims_of(engine)] == ["released"]


async def test_a_pod_deleted_before_its_annotation_fails_the_bind_and_gives_its_claim_back(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.before_patch = lambda path: apiserver.delete_object(path)
    reply = await extender.post("/extender/bind", json=binding)
    apiserver.before_patch = None
    assert (
        "was deleted or re-created under its name before it was annotated"
        in (reply.json()["Error"])
    )
    assert [s for s, _ in await claims_of(engine)] == ["released"]


async def test_a_pod_re_created_between_annotation_and_binding_is_not_bound(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    after = apiserver.patch

    def patch_then_recreate(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        answer = after(path, body)
        recreate(apiserver, "web-0")
        return answer

    apiserver.patch = patch_then_recreate  # type: ignore[method-assign]
    reply = await extender.post("/extender/bind", json=binding)
    assert "before binding" in reply.json()["Error"]
    assert "Precondition failed: UID in precondition" in reply.json()["Error"]
    assert "nodeName" not in apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]["spec"]
    assert [s for s, _ in await claims_of(engine)] == ["released"]


async def test_a_pod_bound_to_another_node_is_not_bound_again_and_gets_no_claim(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]["spec"]["nodeName"] = "node-z"
    reply = await extender.post("/extender/bind", json=binding)
    assert "is already assigned to node node-z" in reply.json()["Error"]
    assert await claims_of(engine) == []


async def test_a_failed_repeat_of_a_bind_keeps_the_claim_the_first_bind_made(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """A repeated bind of a pod already bound to the node must not give back its claim
    (the idempotent create answers with the same claim) when a later step of it fails."""
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    assert (await extender.post("/extender/bind", json=binding)).json().get("Error", "") == ""
    apiserver.before_patch = lambda path: apiserver.delete_object(path)
    reply = await extender.post("/extender/bind", json=binding)
    apiserver.before_patch = None
    assert reply.json().get("Error", "") == ""
    assert await claims_of(engine) == [("placed", "node-a")]


async def test_the_annotation_patch_names_the_pod_instance_it_is_for(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    seen: list[dict[str, Any]] = []
    after = apiserver.patch

    def recording(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        seen.append(body)
        return after(path, body)

    apiserver.patch = recording  # type: ignore[method-assign]
    assert (await extender.post("/extender/bind", json=binding)).json().get("Error", "") == ""
    assert [b["metadata"]["uid"] for b in seen] == [binding["PodUID"]]


async def test_a_bind_refused_after_the_annotation_takes_the_annotation_off_again(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """Another binder assigns the pod between qshare's annotation and its Binding: the
    claim is given back and the pod no longer names it."""
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    path = "/api/v1/namespaces/team-a/pods/web-0"
    after = apiserver.patch

    def patch_then_bind_elsewhere(p: str, body: dict[str, Any]) -> tuple[int, Any]:
        answer = after(p, body)
        apiserver.objects[path]["spec"]["nodeName"] = "node-z"
        apiserver.patch = after  # type: ignore[method-assign]
        return answer

    apiserver.patch = patch_then_bind_elsewhere  # type: ignore[method-assign]
    reply = await extender.post("/extender/bind", json=binding)
    assert 'pod web-0 is already assigned to node "node-z"' in reply.json()["Error"]
    notes = apiserver.objects[path]["metadata"]["annotations"]
    assert not {"qshare.io/vgpus", "qshare.io/claim", "qshare.io/bind-time"} & set(notes)
    assert [s for s, _ in await claims_of(engine)] == ["released"]


async def test_a_binding_applied_whose_answer_is_lost_keeps_the_claim_and_its_annotations(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """The API server binds the pod and the connection drops before its answer: the pod is
    bound, so the bind succeeded, and its claim and annotations stay (else the pod runs on
    the node with no vGPU its device plugin may take)."""
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.lose_post_answers = 1
    reply = await extender.post("/extender/bind", json=binding)
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]
    assert stored["spec"]["nodeName"] == "node-a"
    assert "qshare.io/claim" in stored["metadata"]["annotations"]
    assert await claims_of(engine) == [("placed", "node-a")]
    assert reply.json().get("Error", "") == ""


def fail_reads_after_the_binding(apiserver: ApiServerDouble, reads: int) -> None:
    """The next Binding POST is followed by `reads` GETs answering 503 (the API server
    failing while the extender settles the Binding's lost answer)."""
    after = apiserver.post

    def post_then_fail_reads(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        answer = after(path, body)
        if path.endswith("/binding"):
            apiserver.fail_gets = reads
            apiserver.post = after  # type: ignore[method-assign]
        return answer

    apiserver.post = post_then_fail_reads  # type: ignore[method-assign]


async def test_a_lost_binding_answer_and_a_failed_re_read_keep_the_claim_and_its_annotations(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """The Binding is applied, its answer lost, and every read of the pod after it fails:
    the pod may run on the node, so its claim and annotations stay (the bind reports that
    it could not settle; a later bind or the sweep does)."""
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.lose_post_answers = 1
    fail_reads_after_the_binding(apiserver, reads=100)
    reply = await extender.post("/extender/bind", json=binding)
    apiserver.fail_gets = 0
    assert "kept" in reply.json()["Error"]
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]
    assert stored["spec"]["nodeName"] == "node-a"
    assert "qshare.io/claim" in stored["metadata"]["annotations"]
    assert await claims_of(engine) == [("placed", "node-a")]


async def test_a_lost_binding_answer_is_settled_by_reading_the_pod_again_after_a_failed_read(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    await register(nc, "node-a")
    binding = stored_pod(apiserver, "web-0", "node-a")
    apiserver.lose_post_answers = 1
    fail_reads_after_the_binding(apiserver, reads=1)
    reply = await extender.post("/extender/bind", json=binding)
    assert reply.json().get("Error", "") == ""
    assert await claims_of(engine) == [("placed", "node-a")]


def unsettled_binding(apiserver: ApiServerDouble) -> None:
    """The next Binding is refused by a failing server (503, not applied) and every read of
    the pod after it fails too: the extender cannot tell that the pod is not bound."""
    apiserver.fail_posts = 1
    fail_reads_after_the_binding(apiserver, reads=100)


async def test_a_pod_not_bound_after_an_unsettled_bind_is_bound_by_the_next_bind(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """The scheduler tries the pod again, on another node: it gets a claim there (its key
    is not the first bind's), and the first claim waits for the sweep."""
    await register(nc, "node-a")
    await register(nc, "node-b")
    binding = stored_pod(apiserver, "web-0", "node-a")
    unsettled_binding(apiserver)
    assert "kept" in (await extender.post("/extender/bind", json=binding)).json()["Error"]
    apiserver.fail_gets = 0
    reply = await extender.post("/extender/bind", json=binding | {"Node": "node-b"})
    assert reply.json().get("Error", "") == ""
    stored = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]
    assert stored["spec"]["nodeName"] == "node-b"
    assert await claims_of(engine) == [("placed", "node-a"), ("placed", "node-b")]


async def age_claims(engine: AsyncEngine, seconds: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE claims SET created_at = created_at - make_interval(secs => :s)"),
            {"s": seconds},
        )


async def test_the_sweep_gives_back_the_claim_of_an_unsettled_bind_once_its_grace_is_over(
    extender: httpx.AsyncClient,
    extender_app: FastAPI,
    nc: Client,
    apiserver: ApiServerDouble,
    engine: AsyncEngine,
) -> None:
    """The pod was not bound: after `settle_after_s` its claim is nobody's."""
    await register(nc, "node-a")
    unsettled_binding(apiserver)
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "web-0", "node-a"))
    apiserver.fail_gets = 0
    assert "kept" in reply.json()["Error"]
    reaper = Reaper(extender_app.state.resources)
    assert await reaper.sweep() == []  # a bind may still be under way with it
    await age_claims(engine, 301)
    assert len(await reaper.sweep()) == 1
    assert await claims_of(engine) == [("released", "node-a")]


async def test_the_sweep_keeps_the_claim_a_bound_pod_names_however_old(
    extender: httpx.AsyncClient,
    extender_app: FastAPI,
    nc: Client,
    apiserver: ApiServerDouble,
    engine: AsyncEngine,
) -> None:
    """The unsettled Binding was applied: the pod runs on the node with that claim."""
    await register(nc, "node-a")
    apiserver.lose_post_answers = 1
    fail_reads_after_the_binding(apiserver, reads=100)
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "web-0", "node-a"))
    apiserver.fail_gets = 0
    assert "kept" in reply.json()["Error"]
    await age_claims(engine, 3600)
    assert await Reaper(extender_app.state.resources).sweep() == []
    assert await claims_of(engine) == [("placed", "node-a")]


async def test_a_pod_whose_bind_gave_its_claim_back_is_bound_when_the_scheduler_tries_again(
    extender: httpx.AsyncClient, nc: Client, apiserver: ApiServerDouble, engine: AsyncEngine
) -> None:
    """The first try no longer fits on node-a; the next, on node-b, gets a claim of its own
    (not the given-back one, which its key would name were the key the pod's alone)."""
    await register(nc, "node-a", memory="4Gi")
    await register(nc, "node-b")
    binding = stored_pod(apiserver, "web-0", "node-a")
    assert (await extender.post("/extender/bind", json=binding)).json()["Error"]
    reply = await extender.post("/extender/bind", json=binding | {"Node": "node-b"})
    assert reply.json().get("Error", "") == ""
    assert apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]["spec"]["nodeName"] == "node-b"
    assert ("placed", "node-b") in await claims_of(engine)


async def test_the_sweep_gives_back_an_old_claim_a_bound_pod_does_not_name(
    extender: httpx.AsyncClient,
    extender_app: FastAPI,
    nc: Client,
    apiserver: ApiServerDouble,
    engine: AsyncEngine,
) -> None:
    """A claim of the pod's that its annotation does not name (an earlier bind's, say one
    whose create answer was lost) is nobody's once the grace is over."""
    await register(nc, "node-a")
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "web-0", "node-a"))
    assert reply.json().get("Error", "") == ""
    notes = apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]["metadata"]["annotations"]
    notes["qshare.io/claim"] = str(uuid.uuid4())
    await age_claims(engine, 301)
    assert len(await Reaper(extender_app.state.resources).sweep()) == 1
    assert await claims_of(engine) == [("released", "node-a")]


async def test_a_bind_that_reaches_its_binding_too_late_gives_its_claim_back_unbound(
    extender: httpx.AsyncClient,
    extender_app: FastAPI,
    nc: Client,
    apiserver: ApiServerDouble,
    engine: AsyncEngine,
) -> None:
    """Past half the grace the reaper may soon take the claim for a leftover: the bind
    does not send its Binding (here the grace is 0, so every bind is too late)."""
    extender_app.state.resources.settings.extender.settle_after_s = 0
    await register(nc, "node-a")
    reply = await extender.post("/extender/bind", json=stored_pod(apiserver, "web-0", "node-a"))
    assert "took too long to bind" in reply.json()["Error"]
    assert "nodeName" not in apiserver.objects["/api/v1/namespaces/team-a/pods/web-0"]["spec"]
    assert await claims_of(engine) == [("released", "node-a")]
