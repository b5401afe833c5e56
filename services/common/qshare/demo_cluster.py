"""The cluster-loop part of `qshare demo`: the whole stack on embedded servers and two
simulated nodes; claims over REST reach `ready`, programs run in them with
`qshare run --claim` (against the fake CUDA driver: a test double), high priority preempts a
low-priority gang across cards, an admin changes how one card is shared, and a NATS
subscriber prints the events it saw.

Run alone with `python -m qshare.demo_cluster`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from nats.aio.msg import Msg

from qshare.contracts import envelope
from qshare.native_build import FAKE_DIR, TOOLS, build_cuda
from qshare.natsauth import ServiceRole
from qshare.stack import Stack, StackOptions, running_stack

Out = Callable[[str], None]
GIB = 1 << 30


async def run_cluster_demo(out: Out = print) -> None:
    build_cuda()
    out("starting Postgres, NATS, allocator, API, preemptor and 2 simulated nodes x 2 cards")
    shm = Path(tempfile.mkdtemp(prefix="qshare-demo-"))
    options = StackOptions(nodes=2, cards=2, durable=False, shm_dir=shm, release_delay_s=0.05,
                           heartbeat_s=1.0, node_prefix="demo")  # fmt: skip
    async with running_stack(options) as stack:
        seen = await _subscribe(stack, out)
        headers = {"Authorization": f"Bearer {stack.admin_token}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=headers) as api:
            training = await _ready(api, out, "training (low, gang of 2 cards)",
                                    priority="low", vcore=60, vmemory="8Gi", count=2)  # fmt: skip
            inference = await _ready(api, out, "inference (high)",
                                     priority="high", vcore=40, vmemory="4Gi")  # fmt: skip
            await _run_in_claims(stack, training, inference, out)
            await _preempt(stack, training, inference, out)
            await _share(api, out, training["vgpus"][0]["gpu"])
            for label, claim in (("inference", inference), ("training", training)):
                await _delete(api, out, label, claim)
            await asyncio.sleep(1.0)
        await seen.drain()
    out("stopped; every server and segment removed")


async def _subscribe(stack: Stack, out: Out) -> Any:
    nc = await stack.connect("qshare-demo", ServiceRole.INTEGRATION)

    async def show(msg: Msg) -> None:
        out(f"  [event] {msg.subject}  {event_detail(envelope.decode(msg.data))}")

    await nc.subscribe("qshare.evt.>", cb=show)
    return nc


def event_detail(event: envelope.Envelope) -> str:
    """What happened: the claim's status, the card event's kind, or, for a body that has
    neither (a claim `suspended` or `resumed` names only the claim), the event's type."""
    data = event.data or {}
    return str(data.get("status") or data.get("kind") or event.type.rpartition(".")[2])


async def _ready(api: httpx.AsyncClient, out: Out, label: str, **spec: Any) -> dict[str, Any]:
    created = (await api.post("/v1/claims", json=spec)).json()
    out(f"created {label}: {created['status']} on {created.get('node')}")
    async with asyncio.timeout(30):
        while (claim := (await api.get(f"/v1/claims/{created['id']}")).json())["status"] != "ready":
            await asyncio.sleep(0.05)
    cards = ", ".join(f"{v['gpu']} (vGPU {v['local_id']})" for v in claim["vgpus"])
    out(f"  ready: {cards}")
    return dict(claim)


async def _delete(api: httpx.AsyncClient, out: Out, label: str, claim: dict[str, Any]) -> None:
    """Delete a claim and wait until its node confirmed its vGPUs gone (`released`: no
    longer shown by GET)."""
    deleted = (await api.delete(f"/v1/claims/{claim['id']}")).json()
    out(f"deleted {label}: {deleted['status']}")
    async with asyncio.timeout(30):
        while (await api.get(f"/v1/claims/{claim['id']}")).status_code != 404:
            await asyncio.sleep(0.05)
    out("  released: the node removed its vGPUs from the segment")


async def _run_in_claims(stack: Stack, training: dict[str, Any], inference: dict[str, Any],
                         out: Out) -> None:  # fmt: skip
    for label, claim in (("training", training), ("inference", inference)):
        vgpu = claim["vgpus"][0]
        probe = [str(TOOLS / "probe-direct"), "init", "meminfo"]
        argv = [sys.executable, "-m", "qshare.cli", "run", "--claim", claim["id"],
                "--card", str(vgpu["index"]), "--", *probe]  # fmt: skip
        done = await asyncio.to_thread(subprocess.run, argv, env=_env(stack, claim), text=True,
                                       capture_output=True, timeout=60)  # fmt: skip
        line = next((x for x in done.stdout.splitlines() if x.startswith("meminfo")), done.stderr)
        total = int(line.split("total=")[1].split()[0]) if "total=" in line else 0
        out(f"qshare run --claim {claim['id'][:8]}… ({label}): the program sees "
            f"{total / GIB:g} GiB of a 16 GiB card")  # fmt: skip


def _env(stack: Stack, claim: dict[str, Any]) -> dict[str, str]:
    return os.environ | {
        "QSHARE_URL": stack.url, "QSHARE_TOKEN": stack.admin_token,
        "QSHARE_NODE_NAME": claim["node"], "LD_LIBRARY_PATH": str(FAKE_DIR),
        "QSHARE_FAKE_GPU_UUID": claim["vgpus"][0]["gpu"], "QSHARE_FAKE_GPU_MEM": str(16 * GIB),
    }  # fmt: skip


async def _preempt(stack: Stack, training: dict[str, Any], inference: dict[str, Any],
                   out: Out) -> None:  # fmt: skip
    from qshare_driver import Client

    agent = next(a for a in stack.agents if a.name == inference["node"])
    hp = inference["vgpus"][0]
    other = next(v for v in training["vgpus"] if v["gpu"] != hp["gpu"])
    out(f"high priority launches on {hp['gpu']}; the training gang also holds {other['gpu']}")
    with Client.attach(agent.settings.segment_name, hp["local_id"], agent.settings.shm_dir) as c:
        c.launch_begin()
        await asyncio.sleep(0.5)
        state = agent.node.vgpu_stats(other["local_id"]).suspended
        out(f"  training on {other['gpu']} suspended by the preemptor: {state}")
        c.launch_end()
    await asyncio.sleep(0.5)
    state = agent.node.vgpu_stats(other["local_id"]).suspended
    out(f"high priority idle for the release delay: training resumed: {not state}")


async def _share(api: httpx.AsyncClient, out: Out, gpu: str) -> None:
    """Ask a card's sharing over REST and wait until its node agent has applied it."""
    asked = {"policy": "fixed-share", "lp_window_s": 0.0003}
    (await api.patch(f"/v1/gpus/{gpu}/sharing", json=asked)).raise_for_status()
    out(f"an admin asks {gpu} for {asked} (PATCH /v1/gpus/{{uuid}}/sharing)")
    async with asyncio.timeout(30):
        while (card := (await api.get(f"/v1/gpus/{gpu}")).json())["sharing_pending"]:
            await asyncio.sleep(0.05)
    now = card["sharing"]
    out(f"  applied by its node agent: policy {now['policy']}, LP window "
        f"{now['lp_window_s'] * 1e6:g} µs, release {now['release_mode']}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(run_cluster_demo())
