"""A DRA claim of several devices is in the checkpoint whole or not at all: the plugin
killed between two of the claim's vGPUs leaves no device of it recorded, and the agent
restarted on the segment destroys the vGPUs made before the crash (nobody was answered).
Killed after writing a claim's CDI spec and before saving it, the plugin leaves a spec that
the restarted plugin removes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import grpc
import pytest

from qshare_driver.node import Node
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from . import plugin_process
from .conftest import CARDS, resource_claim, store_claim
from .doubles import ApiServerDouble, KubeletDouble

SEGMENT = "half-claim"


def two_card_claim(name: str) -> dict[str, Any]:
    """A claim of a share of each card; not yet reserved for its pod when the plugin's watch
    sees it, so the prepare reads it from the API server and saves it itself."""
    claim = resource_claim(name, {"memory": "2Gi", "cores": "10"}, device="gpu-0")
    results = claim["status"]["allocation"]["devices"]["results"]
    second = copy.deepcopy(results[0])
    second["device"], second["shareID"] = "gpu-1", second["shareID"][:-1] + "f"
    results.append(second)
    claim["status"]["reservedFor"] = []
    return claim


def crash_at_second_vgpu(
    settings: KubernetesSettings, shm: Path, kubelet: KubeletDouble, claim: tuple[str, str, str]
) -> None:
    process = plugin_process.start(settings, shm, SEGMENT, die_at_create=2)
    killed_in(process, lambda: kubelet.prepare(settings.dra_socket, [claim]))


def killed_in(process: BaseProcess, call: Callable[[], object]) -> None:
    """`call`, a kubelet call, gets no answer: the plugin process kills itself in it."""
    with pytest.raises(grpc.RpcError):
        call()
    process.join(10)
    assert process.exitcode == -9


def test_a_crash_between_a_claims_vgpus_leaves_none_of_them(
    settings: KubernetesSettings,
    shm: Path,
    kubelet: KubeletDouble,
    apiserver: ApiServerDouble,
) -> None:
    claim = store_claim(apiserver, two_card_claim("pair"))
    crash_at_second_vgpu(settings, shm, kubelet, claim)
    with Node.adopt(SEGMENT, shm) as node:
        assert checkpoint.load(checkpoint.checkpoint_path(shm, SEGMENT), SEGMENT) == []
        restarted = LocalVgpus(node, CARDS)
        assert restarted.restore() == []
        assert restarted.prepared() == {}
        assert node.list_vgpus() == []


def test_a_restart_removes_the_cdi_spec_of_a_claim_written_but_never_saved_and_no_other(
    settings: KubernetesSettings,
    shm: Path,
    kubelet: KubeletDouble,
    apiserver: ApiServerDouble,
    kube_api: KubeApi,
) -> None:
    saved = store_claim(apiserver, resource_claim("saved"))
    unsaved = store_claim(apiserver, resource_claim("unsaved"))
    process = plugin_process.start(settings, shm, SEGMENT, die_at_save=2)
    assert kubelet.prepare(settings.dra_socket, [saved]).claims[saved[2]].error == ""
    killed_in(process, lambda: kubelet.prepare(settings.dra_socket, [unsaved]))
    specs = {
        uid: settings.cdi_dir / f"qshare.io-claim_{uid}.json" for _, _, uid in (saved, unsaved)
    }
    assert all(p.is_file() for p in specs.values())  # the crash came after the spec's write
    others = [settings.cdi_dir / n for n in ("nvidia.com-gpu.json", "qshare.io-other.json")]
    for other in others:
        other.write_text("{}")
    with Node.adopt(SEGMENT, shm) as node:
        restarted = LocalVgpus(node, CARDS)
        assert restarted.restore() == []
        plugin = DraPlugin(settings, restarted, kube_api)
        plugin.start()
        plugin.stop()
    assert not specs[unsaved[2]].exists()
    assert specs[saved[2]].is_file()
    assert all(other.read_text() == "{}" for other in others)


def test_a_crash_between_an_unprepares_vgpus_leaves_the_claim_whole_in_the_checkpoint(
    settings: KubernetesSettings,
    shm: Path,
    kubelet: KubeletDouble,
    apiserver: ApiServerDouble,
) -> None:
    """Before, an unprepare saved the checkpoint after each vGPU it released, on its own,
    outside the prepares' group commit: killed between the two, the plugin left half the
    claim in the checkpoint, a claim that no prepare ever made. Now the release is saved
    whole by one group commit, and the restart restores the claim whole (the kubelet, never
    answered, unprepares it again)."""
    claim = store_claim(apiserver, two_card_claim("pair"))
    process = plugin_process.start(settings, shm, SEGMENT, die_at_destroy=2)
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    killed_in(process, lambda: kubelet.unprepare(settings.dra_socket, [claim]))
    saved = checkpoint.load(checkpoint.checkpoint_path(shm, SEGMENT), SEGMENT)
    assert len(saved) == 2
    with Node.adopt(SEGMENT, shm) as node:
        restarted = LocalVgpus(node, CARDS)
        assert restarted.restore() == []
        assert {key.split("/")[1] for key in restarted.prepared()} == {claim[2]}
        assert len(node.list_vgpus()) == 2
