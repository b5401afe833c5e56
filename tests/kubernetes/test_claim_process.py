"""End to end on the node: a process started with a prepared claim's CDI edits runs under
the real interposer against the fake CUDA driver and is held to the claim's memory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from qshare.native_build import FAKE_DIR, TOOLS, build_cuda
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin

from .conftest import CARD_MIB, CARDS, resource_claim, store_claim
from .doubles import ApiServerDouble, KubeletDouble

MIB = 1 << 20


@pytest.fixture(scope="module")
def probe() -> Path:
    build_cuda()
    return TOOLS / "probe-direct"


def container_environment(edits: dict[str, Any]) -> dict[str, str]:
    """The environment a container runtime gives a process from CDI edits; with no container
    here, a path the edits mount is resolved to its host path, as the bind mount would."""
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    env = dict(item.split("=", 1) for item in edits["env"])
    env["LD_PRELOAD"] = mounts[env["LD_PRELOAD"]]
    return env


def run_in_claim(
    probe: Path, edits: dict[str, Any], commands: list[str]
) -> dict[str, dict[str, str]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), **container_environment(edits)}
    env |= {
        "LD_LIBRARY_PATH": str(FAKE_DIR),  # the fake libcuda.so.1: a stand-in for the GPU
        "QSHARE_FAKE_GPU_UUID": CARDS[0].uuid,
        "QSHARE_FAKE_GPU_MEM": str(CARD_MIB * MIB),
    }
    done = subprocess.run(
        [str(probe), *commands], env=env, capture_output=True, text=True, timeout=60
    )
    replies = {}
    for line in done.stdout.splitlines():
        head, *pairs = line.split()
        replies[head] = dict(p.split("=", 1) for p in pairs if "=" in p)
    return replies


def test_a_process_in_a_prepared_claim_sees_and_is_held_to_its_memory(
    probe: Path,
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    claim = store_claim(apiserver, resource_claim("job", consumed={"memory": "3Gi", "cores": "40"}))
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    spec = json.loads(dra.cdi.path(f"claim_{claim[2]}").read_text())
    edits = spec["devices"][0]["containerEdits"]
    replies = run_in_claim(probe, edits, ["init", "meminfo", f"alloc plain {3072 * MIB + 4096}"])
    assert int(replies["meminfo"]["total"]) == 3072 * MIB
    assert replies["alloc"]["rc"] == "2"  # out of memory: over the claim's 3 GiB
