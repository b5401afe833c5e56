"""`qshare run --claim ID -- CMD`: a program runs in its claim's vGPU on the claim's node,
sees the claim's limit and only its card, is refused anywhere else, and its normal exit
reaches subscribers as a detach, not as a death."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus
from qshare.native_build import FAKE_DIR, TOOLS, build_cuda

from .conftest import ADMIN_TOKEN, StartAgent, eventually, ready_claim

QSHARE = str(Path(sys.executable).with_name("qshare"))
GIB = 1 << 30


@pytest.fixture(scope="module")
def cuda_build() -> None:
    build_cuda()


def run_env(api_url: str, node: str, card_uuid: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        QSHARE_URL=api_url, QSHARE_TOKEN=ADMIN_TOKEN, QSHARE_NODE_NAME=node,
        LD_LIBRARY_PATH=str(FAKE_DIR), QSHARE_FAKE_GPU_UUID=card_uuid,
        QSHARE_FAKE_GPU_MEM=str(16 * GIB),
    )  # fmt: skip
    return env


async def qshare_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [QSHARE, "run", *args]
    return await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60
    )


async def test_a_program_run_in_a_claim_sees_its_memory_limit(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    gpu = claim["vgpus"][0]["gpu"]  # type: ignore[index]
    env = run_env(api_url, agent.name, gpu)
    done = await qshare_run(env, "--claim", str(claim["id"]), "--", str(TOOLS / "probe-direct"),
                            "init", "meminfo")  # fmt: skip
    assert done.returncode == 0, done.stderr
    meminfo = next(line for line in done.stdout.splitlines() if line.startswith("meminfo"))
    assert f"total={2 * GIB}" in meminfo


async def test_a_program_sees_only_its_claims_card(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    gpu = claim["vgpus"][0]["gpu"]  # type: ignore[index]
    done = await qshare_run(run_env(api_url, agent.name, gpu), "--claim", str(claim["id"]),
                            "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")  # fmt: skip
    assert done.stdout.strip() == gpu


async def test_a_claim_is_found_by_the_first_digits_of_its_id_as_listings_show_it(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    gpu = claim["vgpus"][0]["gpu"]  # type: ignore[index]
    shown = f"{str(claim['id'])[:8]}…"  # as `qshare claims list` and the demo print it
    done = await qshare_run(run_env(api_url, agent.name, gpu), "--claim", shown,
                            "--", "sh", "-c", "echo $QSHARE_VGPU")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(claim["vgpus"][0]["local_id"])  # type: ignore[index]


async def test_a_claim_id_that_is_no_id_is_refused_by_name(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    agent = await start_agent()
    done = await qshare_run(run_env(api_url, agent.name, "GPU-x"), "--claim", "xyz", "--", "true")
    assert done.returncode == 2
    assert "'xyz' is not a claim id" in done.stderr


async def test_running_a_claim_on_another_node_is_refused(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    env = run_env(api_url, "some-other-node", "GPU-x")
    done = await qshare_run(env, "--claim", str(claim["id"]), "--", "true")
    assert done.returncode == 2
    assert f"runs on node {agent.name}" in done.stderr


def env_of(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


async def test_a_claim_of_two_cards_runs_with_both_vgpus_and_both_cards(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    """Before: refused, asking for --card (one process per card, run one by one)."""
    agent = await start_agent()
    claim = await ready_claim(api, count=2)
    vgpus = sorted(claim["vgpus"], key=lambda v: v["index"])
    env = run_env(api_url, agent.name, "GPU-x")
    done = await qshare_run(env, "--claim", str(claim["id"]), "--", "env")
    assert done.returncode == 0, done.stderr
    seen = env_of(done.stdout)
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(v["gpu"] for v in vgpus)
    named = {k: v for k, v in seen.items() if k.startswith("QSHARE_VGPU_")}
    assert named == {f"QSHARE_VGPU_{v['local_id']}": v["gpu"] for v in vgpus}
    assert len(named) == 2


async def test_a_claim_of_two_cards_runs_on_the_card_named_alone(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    """A guard: --card keeps the one-vGPU form."""
    agent = await start_agent()
    claim = await ready_claim(api, count=2)
    chosen = max(claim["vgpus"], key=lambda v: v["index"])
    env = run_env(api_url, agent.name, chosen["gpu"])
    done = await qshare_run(env, "--claim", str(claim["id"]), "--card", str(chosen["index"]),
                            "--", "env")  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = env_of(done.stdout)
    assert (seen["CUDA_VISIBLE_DEVICES"], seen["QSHARE_VGPU"]) == (
        chosen["gpu"],
        str(chosen["local_id"]),
    )
    assert not [k for k in seen if k.startswith("QSHARE_VGPU_")]


async def test_a_card_the_claim_does_not_hold_is_refused_by_name(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None
) -> None:
    """A guard."""
    agent = await start_agent()
    claim = await ready_claim(api, count=2)
    env = run_env(api_url, agent.name, "GPU-x")
    done = await qshare_run(env, "--claim", str(claim["id"]), "--card", "7", "--", "true")
    assert done.returncode == 2
    assert "holds no card 7" in done.stderr


async def test_a_program_that_exits_normally_is_published_as_detached(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None, nc: Nats
) -> None:
    agent = await start_agent()
    claim = await ready_claim(api)
    gpu = claim["vgpus"][0]["gpu"]  # type: ignore[index]
    kinds: list[str] = []

    async def note(msg: Msg) -> None:
        kinds.append(msg.subject.rsplit(".", 1)[-1])

    sub = await nc.subscribe(f"qshare.evt.gpu.{agent.name}.{gpu}.*", cb=note)
    await bus.settled(nc)
    done = await qshare_run(run_env(api_url, agent.name, gpu), "--claim", str(claim["id"]),
                            "--", str(TOOLS / "probe-direct"), "init", "launch kernel 100 5",
                            "sync")  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def detached() -> bool:
        return "detach" in kinds

    await eventually(detached)
    await sub.unsubscribe()
    assert kinds.count("attach") == 1 and kinds.count("detach") == 1
    assert "client_died" not in kinds


async def test_a_process_of_a_two_card_claim_attaches_to_the_vgpu_of_the_card_it_uses(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent, cuda_build: None, nc: Nats
) -> None:
    """The whole path: `qshare run` names both vGPUs, and the interposer (fake CUDA driver of
    two devices) attaches the process to the vGPU of the card it launches on, not the other."""
    agent = await start_agent()
    claim = await ready_claim(api, count=2)
    vgpus = sorted(claim["vgpus"], key=lambda v: v["index"])
    attached: list[str] = []

    async def note(msg: Msg) -> None:
        if msg.subject.endswith(".attach"):
            attached.append(msg.subject.split(".")[4])

    sub = await nc.subscribe(f"qshare.evt.gpu.{agent.name}.*.*", cb=note)
    await bus.settled(nc)
    env = run_env(api_url, agent.name, vgpus[0]["gpu"])
    env.update(QSHARE_FAKE_GPU_COUNT="2", QSHARE_FAKE_GPU_UUID_0=vgpus[0]["gpu"],
               QSHARE_FAKE_GPU_UUID_1=vgpus[1]["gpu"])  # fmt: skip
    done = await qshare_run(env, "--claim", str(claim["id"]), "--", str(TOOLS / "probe-direct"),
                            "init 1", "launch kernel 100 5", "sync")  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def seen() -> bool:
        return bool(attached)

    await eventually(seen)
    await bus.settled(nc)
    await sub.unsubscribe()
    assert attached == [vgpus[1]["gpu"]]
