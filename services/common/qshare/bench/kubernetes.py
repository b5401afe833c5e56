"""`qshare bench kubernetes`: the Kubernetes paths' latency.

DRA: 100 claims prepared concurrently (one NodePrepareResources call each, as the kubelet
sends one per pod) over the plugin's unix socket, on a simulated 8-card node with the real
driver segment; each claim is then checked usable (its vGPU in the segment with the claim's
limit, its CDI spec on disk). The claims reach the API server after the plugin started, as
the scheduler allocates them in a cluster, so the plugin's LIST + WATCH cache receives them
as watch events; the result counts the prepares served from it and those that fell back to
a GET, and the checkpoint saves their group commits made. Baselines in the same run: the
same 100 prepares made directly on the backend (no gRPC, no API server); the 100 claim GETs
alone against the API server double (a Python http.server in its own process: what each
prepare paid before the cache); and 100 empty NodePrepareResources at once after the
prepares (the Python gRPC round trip on its own).

Extender: filter then prioritize over 1,000 simulated nodes (8 cards each) registered in a
real allocator (Postgres, NATS), through the API process's extender verbs. Baseline in the
same run: the allocator's placement preview over NATS alone.

The API server is `qshare.testing.kube_apiserver`, a loopback test double.

The bench's clients (the kubelet process, the extender's HTTP client) send one request
that is not measured before their measured loop (the services' cold first request is not
what the bench is for), and run that loop with their own garbage collector frozen and off
(`_client_gc_off`), so the client's collection pauses do not show as the service's
latency. The services under test keep their collectors as deployed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import grpc
import httpx
import nats
from nats.aio.client import Client

from qshare.bench.stats import percentiles
from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec
from qshare.contracts.domain import HOSTNAME_LABEL, Priority
from qshare.contracts.nodes import NodeRegistration, NodeView
from qshare.contracts.placement import PlacementPreview, PreviewPlacement
from qshare.testing.kube_apiserver import ApiServerDouble
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, ServiceProcess, free_port

NODE = "bench-node"
CARDS = 8
CARD_MIB = 81920
MIB = 1 << 20
QS = (50, 99)
LOW = Priority.LOW
SEGMENT_DIR = "/dev/shm"  # the segment, its checkpoint and the CDI specs (/var/run/cdi)
# live on tmpfs, as deployed
CORES = 5  # 100 claims on 8 cards: at most 13 a card, 65 % of its low-priority share


def run(args: argparse.Namespace) -> dict[str, Any]:
    claims, nodes, rounds = (20, 100, 20) if args.quick else (100, 1000, 200)
    result: dict[str, Any] = {"dra": _dra(claims)}
    result["extender"] = asyncio.run(_extender(nodes, rounds))
    result["dra_prepare_ms"] = result["dra"]["prepare_ms"]
    result["claims_prepared"] = result["dra"]["claims_usable"]
    result["extender_filter_ms"] = result["extender"]["filter_ms"]
    return result


def table(result: dict[str, Any]) -> str:
    dra, ext = result["dra"], result["extender"]
    rows = [
        ("DRA NodePrepareResources", dra["prepare_ms"], f"{dra['claims']} claims, {CARDS} cards"),
        ("  baseline: backend.prepare", dra["backend_prepare_ms"], "same claims, direct"),
        ("  baseline: claim GET", dra["api_get_ms"], "API server double, all at once"),
        ("  baseline: empty gRPC call", dra["grpc_empty_ms"], "as many at once, no claim"),
        ("extender filter", ext["filter_ms"], f"{ext['nodes']} nodes"),
        ("extender filter+prioritize", ext["filter_prioritize_ms"], f"{ext['rounds']} pods"),
        ("  baseline: allocator preview", ext["preview_ms"], "NATS only"),
    ]
    lines = [f"{'path':<30} {'p50 ms':>8} {'p99 ms':>8}  note"]
    lines += [f"{n:<30} {p['p50']:>8.2f} {p['p99']:>8.2f}  {note}" for n, p, note in rows]
    lines.append(
        f"claims usable after prepare: {dra['claims_usable']}/{dra['claims']} "
        f"({dra['claims_from_cache']} read from the watch cache, {dra['claims_got']} by GET, "
        f"{dra['checkpoint_saves']} checkpoint saves); "
        f"prepare p99 / backend p99 = {dra['p99_ratio']}; "
        f"filter+prioritize p99 / preview p99 = {ext['p99_ratio']}"
    )
    return "\n".join(lines)


# -- DRA --------------------------------------------------------------------------------------
def _claim(name: str, card: int) -> dict[str, Any]:
    result = {
        "request": "gpu", "driver": "qshare.io", "pool": NODE, "device": f"gpu-{card}",
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "2Gi", "cores": str(CORES)},
    }  # fmt: skip
    selector = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [selector]}]},
            },
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
        },
    }


def _dra(count: int) -> dict[str, Any]:
    from qshare_driver.node import Node
    from qshare_node_agent.discovery import Card
    from qshare_node_agent.kubernetes.apiserver import KubeApi
    from qshare_node_agent.kubernetes.config import KubernetesSettings
    from qshare_node_agent.kubernetes.dra import DraPlugin
    from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

    root = Path(tempfile.mkdtemp(prefix="qkb-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="qkb-", dir=SEGMENT_DIR))
    claims = [_claim(f"c{i}", i % CARDS) for i in range(count)]
    api, (api_url, to_api) = _start(_serve_api)
    cards = [Card(i, f"GPU-bench-{i}", "Simulated", CARD_MIB) for i in range(CARDS)]
    settings = KubernetesSettings(
        node_name=NODE, registry_dir=root / "reg", plugin_dir=root / "plugin",
        cdi_dir=shm / "cdi", api_server=api_url, token_file=None, ca_file=None,
    )  # fmt: skip
    try:
        with Node.create(f"bench-{os.getpid()}", shm) as node:
            for card in cards:
                node.add_card(card.index, card.uuid, card.memory_mib * MIB)
            backend = LocalVgpus(node, cards)
            direct = _concurrently(
                [
                    functools.partial(backend.prepare, f"direct/{i}", i % CARDS, LOW, CORES, 2048)
                    for i in range(count)
                ]
            )
            for key in list(backend.prepared()):
                backend.release(key)
            kube = KubeApi(api_url)
            plugin = DraPlugin(settings, backend, kube)
            plugin.start()
            try:
                to_api.send(claims)  # the scheduler allocates them: the watch delivers them
                to_api.recv()
                kubelet, (prepared, empty) = _start(_kubelet, str(settings.dra_socket), claims)
                kubelet.join()
                usable = sum(_usable(plugin, node, c) for c in claims)
                gets = _concurrently(
                    [
                        functools.partial(kube.resource_claim, "bench", c["metadata"]["name"])
                        for c in claims
                    ]
                )
                cached = plugin.claims.hits
                saves = plugin.commits.flushes
            finally:
                plugin.stop()
                kube.close()
    finally:
        api.terminate()
        api.join()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    prepare = percentiles(prepared, QS)
    backend_ms = percentiles(direct, QS)
    return {
        "claims": count,
        "claims_usable": usable,
        "prepare_ms": prepare,
        "backend_prepare_ms": backend_ms,
        "api_get_ms": percentiles(gets, QS),
        "grpc_empty_ms": percentiles(empty, QS),
        "claims_from_cache": cached,
        "claims_got": count - cached,
        "checkpoint_saves": saves,
        "p99_ratio": round(prepare["p99"] / max(backend_ms["p99"], 1e-6), 1),
    }


def _start(target: Callable[..., None], *args: Any) -> tuple[BaseProcess, Any]:
    """Run `target(*args, pipe)` in a fresh process (the kubelet and the API server are other
    processes than the node agent); return it with the first thing it sends."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=target, args=(*args, theirs), daemon=True)
    process.start()
    return process, mine.recv()


def _serve_api(pipe: Connection) -> None:
    """The API server double, until terminated: sends its URL and a pipe end; stores the
    claims sent there (answering when they are stored)."""
    api = ApiServerDouble()
    mine, theirs = multiprocessing.Pipe()
    pipe.send((api.url, theirs))
    for c in mine.recv():
        name = c["metadata"]["name"]
        api.put_object(f"/apis/resource.k8s.io/v1/namespaces/bench/resourceclaims/{name}", c)
    mine.send(True)
    threading.Event().wait()


def _kubelet(socket: str, claims: list[dict[str, Any]], pipe: Connection) -> None:
    """The kubelet's side: every claim's NodePrepareResources at once; sends the latencies
    (and those of the empty requests)."""
    pipe.send(_prepare_all(Path(socket), claims))


def _concurrently(calls: list[Callable[[], object]]) -> list[float]:
    """Run every call at once, each in its own thread; the latencies in ms of those that
    succeeded (a failure is left out, and shows as a claim that is not usable)."""
    latencies: list[float] = []
    start = threading.Barrier(len(calls))

    def timed(call: Callable[[], object]) -> None:
        start.wait()
        began = time.perf_counter()
        try:
            call()
        except Exception as exc:
            print(f"qshare bench kubernetes: {exc}")
            return
        latencies.append((time.perf_counter() - began) * 1000)

    threads = [threading.Thread(target=timed, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def _prepare_all(socket: Path, claims: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The prepares' latencies, then those of as many empty requests at once afterwards (the
    gRPC round trip on its own: the transport's share of every prepare). One asyncio client,
    as the kubelet's goroutines are cheap: a hundred Python threads would cost this process
    more CPU than the kubelet spends, on the same two cores as the plugin."""
    return asyncio.run(_prepare_all_async(socket, claims))


async def _prepare_all_async(
    socket: Path, claims: list[dict[str, Any]]
) -> tuple[list[float], list[float]]:
    from qshare_node_agent.kubernetes import wire

    api = wire.api(wire.DRA_V1)
    async with grpc.aio.insecure_channel(wire.unix_target(socket)) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=10)
        call = wire.stub(api, "DRAPlugin", channel)["NodePrepareResources"]

        async def prepare(claim: dict[str, Any]) -> None:
            meta = claim["metadata"]
            request = api.message("NodePrepareResourcesRequest")
            request.claims.add(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            answer = (await call(request, timeout=30)).claims[meta["uid"]]
            if answer.error:
                raise RuntimeError(answer.error)

        async def empty() -> None:
            await call(api.message("NodePrepareResourcesRequest"), timeout=30)

        await empty()  # warm-up, not measured
        with _client_gc_off():
            prepared = await _at_once([functools.partial(prepare, c) for c in claims])
            return prepared, await _at_once([empty] * len(claims))


@contextlib.contextmanager
def _client_gc_off() -> Iterator[None]:
    """The bench client's own heap frozen (never scanned again) and its collector off for
    the measured loop; only ever used in a client process, never in a service's."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def _at_once(calls: list[Callable[[], Awaitable[None]]]) -> list[float]:
    """Start every call at once on this loop; the latencies in ms of those that succeeded."""
    latencies: list[float] = []

    async def timed(call: Callable[[], Awaitable[None]]) -> None:
        began = time.perf_counter()
        try:
            await call()
        except Exception as exc:
            print(f"qshare bench kubernetes: {exc}")
            return
        latencies.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(timed(c) for c in calls))
    return latencies


def _usable(plugin: Any, node: Any, claim: dict[str, Any]) -> bool:
    """The claim's vGPU is in the segment with its limit, and its CDI spec names it."""
    uid = claim["metadata"]["uid"]
    spec_path = plugin.cdi.path(f"claim_{uid}")
    if not spec_path.is_file():
        return False
    env = json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["env"]
    vgpu = int(next(e for e in env if e.startswith("QSHARE_VGPU=")).split("=", 1)[1])
    return bool(node.vgpu_stats(vgpu).mem_limit == 2048 * MIB)


# -- extender ---------------------------------------------------------------------------------
def _pod(i: int) -> dict[str, Any]:
    limits = {"qshare.io/vcore": str(10 + i % 5 * 10), "qshare.io/vmemory": str(1024 * (1 + i % 8))}
    return {
        "metadata": {"name": f"p{i}", "namespace": "bench", "uid": str(uuid.uuid4()),
                     "annotations": {"qshare.io/priority": "high" if i % 2 else "low"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }  # fmt: skip


async def _extender(nodes: int, rounds: int) -> dict[str, Any]:
    async with _control_plane() as (nc, url):
        await _register(nc, nodes)
        names = [f"node-{n:04d}" for n in range(nodes)]
        preview: list[float] = []
        filtering: list[float] = []
        both: list[float] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await _time_preview(nc, _pod(rounds), names)  # warm-up, not measured
            await _filter_prioritize(http, _pod(rounds), names)
            with _client_gc_off():
                for i in range(rounds):
                    pod = _pod(i)
                    preview.append(await _time_preview(nc, pod, names))
                    filter_ms, both_ms = await _filter_prioritize(http, pod, names)
                    filtering.append(filter_ms)
                    both.append(both_ms)
    combined = percentiles(both, QS)
    base = percentiles(preview, QS)
    return {
        "nodes": nodes,
        "rounds": rounds,
        "filter_ms": percentiles(filtering, QS),
        "filter_prioritize_ms": combined,
        "preview_ms": base,
        "p99_ratio": round(combined["p99"] / max(base["p99"], 1e-6), 1),
    }


async def _filter_prioritize(
    http: httpx.AsyncClient, pod: dict[str, Any], names: list[str]
) -> tuple[float, float]:
    """Filter, then prioritize the nodes that fit: ms to the filter's answer and to both."""
    began = time.perf_counter()
    reply = await http.post("/extender/filter", json={"Pod": pod, "NodeNames": names})
    fits = reply.json()["NodeNames"]
    filtered = (time.perf_counter() - began) * 1000
    await http.post("/extender/prioritize", json={"Pod": pod, "NodeNames": fits})
    return filtered, (time.perf_counter() - began) * 1000


async def _time_preview(nc: Client, pod: dict[str, Any], names: list[str]) -> float:
    from qshare_api.extender.pods import claim_spec

    spec: ClaimSpec = claim_spec(pod, 1)
    began = time.perf_counter()
    await rpc.call(
        nc,
        subjects.PLACEMENT_PREVIEW,
        "bench",
        PreviewPlacement(spec=spec, nodes=names),
        PlacementPreview,
        timeout=30,
    )
    return (time.perf_counter() - began) * 1000


@contextlib.asynccontextmanager
async def _control_plane() -> AsyncIterator[tuple[Client, str]]:
    """Postgres, NATS, one allocator process and one API process with the extender on."""
    from qshare_allocator.migrate import upgrade

    async with EmbeddedPostgres(durable=False) as pg, EmbeddedNats() as bus:
        await upgrade(pg.url)
        common = {"QSHARE_NODE_TIMEOUT_S": "86400"}
        port = free_port()
        api_env = common | {
            "QSHARE_API_DATABASE_URL": pg.url, "QSHARE_API_NATS_URL": bus.url,
            "QSHARE_API_PORT": str(port), "QSHARE_EXTENDER_ENABLED": "true",
        }  # fmt: skip
        allocator_env = common | {
            "QSHARE_ALLOCATOR_DATABASE_URL": pg.url, "QSHARE_ALLOCATOR_NATS_URL": bus.url,
        }  # fmt: skip
        async with (
            ServiceProcess("qshare_allocator", allocator_env, "serving"),
            ServiceProcess("qshare_api", api_env, "startup complete"),
        ):
            nc = await nats.connect(bus.url)
            try:
                yield nc, f"http://127.0.0.1:{port}"
            finally:
                await nc.close()


async def _register(nc: Client, nodes: int) -> None:
    async def one(n: int) -> None:
        name = f"node-{n:04d}"
        gpus = [
            {"uuid": f"GPU-{n:04d}-{i}", "index": i, "model": "A100-80GB", "memory": "80Gi"}
            for i in range(CARDS)
        ]
        body = {"name": name, "labels": {HOSTNAME_LABEL: name}, "gpus": gpus}
        registration = NodeRegistration.model_validate(body)
        await rpc.call(nc, subjects.NODES_REGISTER, "bench", registration, NodeView, timeout=30)

    for start in range(0, nodes, 32):
        await asyncio.gather(*(one(n) for n in range(start, min(nodes, start + 32))))
