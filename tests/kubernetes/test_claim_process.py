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
from .test_multi_vgpu_container import inject, prepared_ids

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


def merged_container(settings: KubernetesSettings, ids: list[str]) -> dict[str, str]:
    """The environment of a container given CDI devices `ids` of several claims, merged as
    containerd and CRI-O merge them (test_multi_vgpu_container.inject), the interposer's
    mount resolved to its host path as in container_environment."""
    env = inject(settings.cdi_dir, ids)["env"]
    spec = json.loads(next(settings.cdi_dir.glob("*.json")).read_text())
    mounts = {
        m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]
    }
    return env | {"LD_PRELOAD": mounts[env["LD_PRELOAD"]]}


def run_with_two_cards(
    probe: Path, env: dict[str, str], commands: list[str]
) -> dict[str, dict[str, str]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), **env}
    env |= {
        "LD_LIBRARY_PATH": str(FAKE_DIR),  # the fake libcuda.so.1 of two devices: a stand-in
        "QSHARE_FAKE_GPU_COUNT": "2",
        "QSHARE_FAKE_GPU_UUID_0": CARDS[0].uuid,
        "QSHARE_FAKE_GPU_UUID_1": CARDS[1].uuid,
        "QSHARE_FAKE_GPU_MEM": str(CARD_MIB * MIB),
    }
    done = subprocess.run(
        [str(probe), *commands], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return {
        line.split()[0]: dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
        for line in done.stdout.splitlines()
    }


@pytest.mark.parametrize("order", ["left-first", "right-first"])
def test_a_process_given_two_claims_sees_both_cards_in_card_order(
    probe: Path,
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    order: str,
) -> None:
    """A container referencing two single-card claims. Before: each claim's devices set
    CUDA_VISIBLE_DEVICES to that claim's card, the runtime kept one, and the process saw
    one card (the driver enumerated only it). Now the interposer lists both, by card index,
    whichever claim the kubelet gives first; device 1 is the second claim's vGPU."""
    left = store_claim(apiserver, resource_claim("left", {"memory": "2Gi", "cores": "20"}, "gpu-0"))
    right = store_claim(
        apiserver, resource_claim("right", {"memory": "3Gi", "cores": "20"}, "gpu-1")
    )
    claims = [left, right] if order == "left-first" else [right, left]
    ids = [i for claim in claims for i in prepared_ids(kubelet, settings, claim)]
    env = merged_container(settings, ids)
    replies = run_with_two_cards(probe, env, ["cards", "init 1", "meminfo 1"])
    assert replies["cards"]["uuids"] == f"{CARDS[0].uuid},{CARDS[1].uuid}"
    assert replies["init"]["rc"] == "0"
    assert int(replies["meminfo"]["total"]) == 3072 * MIB  # the right claim's vGPU, on card 1
