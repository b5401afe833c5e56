"""Several vGPUs in one container: the environment and CDI specs the DRA plugin and the
device plugin produce, as a container runtime applies them (the interposer's binding is
tested in native/cuda)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from qshare_driver.node import Node
from qshare_node_agent.kubernetes import cdi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.container_env import VGPU_PREFIX
from qshare_node_agent.kubernetes.device_plugin import DevicePlugin
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, NODE, resource_claim, store_claim, validate_cdi, wait_for
from .doubles import ApiServerDouble, KubeletDouble

BOTH_CARDS = f"{CARDS[0].uuid},{CARDS[1].uuid}"
VISIBLE_PREFIX = "QSHARE_VISIBLE_"  # the name the interposer reads (native/cuda/visible.c)
BOTH_VISIBLE = {f"QSHARE_VISIBLE_{c.index}": c.uuid for c in CARDS[:2]}


def card_nodes(index: int) -> tuple[str, ...]:
    """Stand-in device nodes (the simulated cards have none on this host)."""
    return (f"/dev/nvidia{index}", "/dev/nvidiactl", "/dev/nvidia-uvm")


@pytest.fixture
def backend(node: Node) -> LocalVgpus:
    return LocalVgpus(node, CARDS, min_vgpu_mib=1024, device_nodes=card_nodes)


def inject(
    directory: Path, ids: list[str], keep: Literal["last", "first"] = "last"
) -> dict[str, Any]:
    """What a container given the CDI devices `ids` (in the kubelet's order) gets, as the
    CDI library containerd and CRI-O use applies them (`Cache.InjectDevices`): each spec's
    own edits once, before its first device's, then each device's; a variable set again
    replaces the earlier value (runtime-tools' `AddMultipleProcessEnv`). keep="first" is
    the reading of the spec's words ("appended to the container environment"), where a
    program's getenv finds the first of two entries. Device nodes are kept once by path."""
    devices: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.json")):
        spec = json.loads(path.read_text())
        validate_cdi(spec)
        for device in spec["devices"]:
            devices[f"{spec['kind']}={device['name']}"] = (spec, device["containerEdits"])
    env: dict[str, str] = {}
    nodes: dict[str, None] = {}
    applied: set[int] = set()
    for qualified in ids:
        spec, edits = devices[qualified]
        steps = [edits]
        if id(spec) not in applied:
            applied.add(id(spec))
            steps.insert(0, spec.get("containerEdits", {}))
        for step in steps:
            for item in step.get("env", []):
                name, _, value = item.partition("=")
                if keep == "last" or name not in env:
                    env[name] = value
            nodes |= dict.fromkeys(n["path"] for n in step.get("deviceNodes", []))
    return {"env": env, "device_nodes": list(nodes)}


def two_card_claim(name: str) -> dict[str, Any]:
    """A claim of two devices: a share of card 0 and one of card 1."""
    claim = resource_claim(name, {"memory": "2Gi", "cores": "10"}, device="gpu-0")
    results = claim["status"]["allocation"]["devices"]["results"]
    second = copy.deepcopy(results[0])
    second["device"], second["shareID"] = "gpu-1", str(uuid.uuid4())
    results.append(second)
    return claim


def prepared_ids(kubelet: KubeletDouble, settings: KubernetesSettings, claim: Any) -> list[str]:
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    return [i for device in answer.devices for i in device.cdi_device_ids]


def vgpu_variables(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(VGPU_PREFIX)}


def visible_variables(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(VISIBLE_PREFIX)}


def expected_variables(backend: LocalVgpus) -> dict[str, str]:
    return {f"QSHARE_VGPU_{v.vgpu_id}": v.card_uuid for v in backend.prepared().values()}


@pytest.mark.parametrize("keep", ["last", "first"])
def test_a_claim_of_two_cards_gives_its_container_both_vgpus_and_both_cards(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
    keep: Literal["last", "first"],
) -> None:
    """Before: each device set CUDA_VISIBLE_DEVICES to its own card, so the container kept
    one card (whichever device the runtime applied last), and named one vGPU only. Now each
    names its card's index, and the interposer lists both (test_claim_process.py runs it)."""
    claim = store_claim(apiserver, two_card_claim("pair"))
    ids = prepared_ids(kubelet, settings, claim)
    assert len(ids) == 2
    container = inject(settings.cdi_dir, ids, keep)
    env = container["env"]
    assert vgpu_variables(env) == expected_variables(backend)
    assert len(vgpu_variables(env)) == 2
    assert visible_variables(env) == BOTH_VISIBLE
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(container["device_nodes"])
    assert env["QSHARE_VGPU"] in {str(v.vgpu_id) for v in backend.prepared().values()}


def test_a_container_given_devices_of_two_claims_names_every_vgpu(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """Each vGPU's variable is a name of its own, so none is lost in the merge; the cards'
    device nodes add up too, and so do the cards' QSHARE_VISIBLE_<index>. Before, each
    claim's devices set CUDA_VISIBLE_DEVICES to the claim's cards, and the container kept the
    last claim's: one card of two."""
    first = store_claim(apiserver, resource_claim("left", device="gpu-0"))
    second = store_claim(apiserver, resource_claim("right", device="gpu-1"))
    ids = prepared_ids(kubelet, settings, first) + prepared_ids(kubelet, settings, second)
    container = inject(settings.cdi_dir, ids)
    assert vgpu_variables(container["env"]) == expected_variables(backend)
    assert len(vgpu_variables(container["env"])) == 2
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(container["device_nodes"])
    assert visible_variables(container["env"]) == BOTH_VISIBLE
    assert "CUDA_VISIBLE_DEVICES" not in container["env"]


def test_a_claim_of_two_shares_of_one_card_lists_the_card_once(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    body = two_card_claim("same-card")
    body["status"]["allocation"]["devices"]["results"][1]["device"] = "gpu-0"
    ids = prepared_ids(kubelet, settings, store_claim(apiserver, body))
    env = inject(settings.cdi_dir, ids)["env"]
    assert visible_variables(env) == {"QSHARE_VISIBLE_0": CARDS[0].uuid}
    assert set(vgpu_variables(env).values()) == {CARDS[0].uuid}
    assert len(vgpu_variables(env)) == 2


def test_a_spec_of_several_cards_still_rebuilds_the_checkpoint(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """A guard: the checkpoint's rebuild reads each device's own vGPU back from the spec."""
    claim = store_claim(apiserver, two_card_claim("rebuilt"))
    prepared_ids(kubelet, settings, claim)
    recorded = cdi.recorded_vgpus(settings.cdi_dir)
    assert set(recorded) == {v.vgpu_id for v in backend.prepared().values()}


def test_a_device_naming_its_vgpu_only_by_its_own_variable_is_read_back(
    short_dir: Path,
) -> None:
    """A spec whose devices set QSHARE_VGPU_<id> and no QSHARE_VGPU (should a later version
    drop it) still names its vGPUs for a rebuild; before, such a spec was skipped."""
    spec = {
        "cdiVersion": cdi.CDI_VERSION,
        "kind": cdi.KIND,
        "devices": [
            {"name": "a", "containerEdits": {"env": [f"QSHARE_VGPU_2147483648={CARDS[0].uuid}"]}},
            {"name": "b", "containerEdits": {"env": [f"QSHARE_VGPU_2147483649={CARDS[1].uuid}"]}},
        ],
    }
    validate_cdi(spec)
    (short_dir / "qshare.io-claim_u1.json").write_text(json.dumps(spec))
    recorded = cdi.recorded_vgpus(short_dir)
    assert {k: r.key for k, r in recorded.items()} == {
        2147483648: "dra/u1/recovered/a",
        2147483649: "dra/u1/recovered/b",
    }


# -- the device plugin ---------------------------------------------------------------------
@pytest.fixture
def plugin(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: Any, kubelet: KubeletDouble
) -> Iterator[DevicePlugin]:
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    dp = DevicePlugin(settings, backend, kube_api)
    dp.start()
    wait_for(lambda: len(kubelet.device_plugins) == 2)
    yield dp
    dp.stop()


def bound_pod_of_two_cards(apiserver: ApiServerDouble, name: str, vcore: int) -> list[str]:
    """A pod as the extender leaves it, its claim holding a vGPU on each card."""
    vgpus: list[dict[str, Any]] = [
        {
            "id": str(uuid.uuid4()),
            "node": NODE,
            "gpu": card.uuid,
            "index": card.index,
            "vcore": vcore,
            "vmemory_mib": 2048,
            "priority": "low",
        }
        for card in CARDS
    ]
    limits = {"qshare.io/vcore": str(vcore), "qshare.io/vmemory": "8"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": str(uuid.uuid4()),
            "annotations": {"qshare.io/vgpus": json.dumps(vgpus), "qshare.io/bind-time": "1"},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }
    apiserver.put_object(f"/api/v1/namespaces/default/pods/{name}", pod)
    return [str(v["id"]) for v in vgpus]


def test_an_allocate_for_a_container_of_two_vgpus_gives_both_and_both_cards(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """Before: refused ("has 2 vGPUs; a container uses one")."""
    ids = bound_pod_of_two_cards(apiserver, "ddp", vcore=20)
    api, stub = kubelet.device_plugin(settings.device_plugin_dir / "qshare-vcore.sock")
    request = api.message("AllocateRequest")
    request.container_requests.add(devices_ids=[f"{CARDS[0].uuid}-c{n}" for n in range(20)])
    [container] = stub["Allocate"](request, timeout=10).container_responses
    assert {k.removeprefix("allocator/") for k in backend.prepared()} == set(ids)
    envs = dict(container.envs)
    assert vgpu_variables(envs) == expected_variables(backend)
    assert len(vgpu_variables(envs)) == 2
    assert envs["CUDA_VISIBLE_DEVICES"] == BOTH_CARDS  # all in one answer: set here too
    assert visible_variables(envs) == BOTH_VISIBLE
    paths = [d.container_path for d in container.devices]
    assert sorted(paths) == sorted(set(paths))  # each node once
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(paths)
    mounts = [m.container_path for m in container.mounts]
    assert len(mounts) == len(set(mounts))  # the interposer once
    attach = {f".v{v.vgpu_id}" for v in backend.prepared().values()}
    assert all(any(m.endswith(a) for m in mounts) for a in attach)  # each attach directory
