"""The device plugin path, driven over its unix sockets as the kubelet drives it."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.backend import CardInfo
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.device_plugin import KUBELET_MAX_MESSAGE, DevicePlugin, wire
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, NODE, wait_for
from .doubles import ApiServerDouble, KubeletDouble


@pytest.fixture
def plugin(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: KubeApi, kubelet: KubeletDouble
) -> Iterator[DevicePlugin]:
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    dp = DevicePlugin(settings, backend, kube_api)
    dp.start()
    wait_for(lambda: len(kubelet.device_plugins) == 2)
    yield dp
    dp.stop()


def bound_pod(
    apiserver: ApiServerDouble, name: str, vcore: int = 30, card: int = 0, bind_time: str = "1"
) -> str:
    """A pod as the extender leaves it: bound to this node, its vGPU in an annotation."""
    vgpu = {
        "id": str(uuid.uuid4()),
        "node": NODE,
        "gpu": CARDS[card].uuid,
        "index": card,
        "vcore": vcore,
        "vmemory_mib": 2048,
        "priority": "low",
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": str(uuid.uuid4()),
            "annotations": {
                "qshare.io/vgpus": json.dumps([vgpu]),
                "qshare.io/bind-time": bind_time,
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "limits": {"qshare.io/vcore": str(vcore), "qshare.io/vmemory": "8"}
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }
    apiserver.put_object(f"/api/v1/namespaces/default/pods/{name}", pod)
    return vgpu["id"]


def allocate(kubelet: KubeletDouble, settings: KubernetesSettings, count: int) -> Any:
    api, calls = kubelet.device_plugin(settings.device_plugin_dir / "qshare-vcore.sock")
    request = api.message("AllocateRequest")
    request.container_requests.add(devices_ids=[f"{CARDS[0].uuid}-c{n}" for n in range(count)])
    return calls["Allocate"](request, timeout=10)


def test_both_resources_register_with_the_kubelet(
    plugin: DevicePlugin, kubelet: KubeletDouble
) -> None:
    seen = {(r.resource_name, r.endpoint, r.version) for r in kubelet.device_plugins}
    assert seen == {
        ("qshare.io/vcore", "qshare-vcore.sock", "v1beta1"),
        ("qshare.io/vmemory", "qshare-vmemory.sock", "v1beta1"),
    }


def test_stopping_the_plugin_twice_is_harmless(
    plugin: DevicePlugin, settings: KubernetesSettings
) -> None:
    plugin.stop()
    plugin.stop()
    assert not (settings.device_plugin_dir / "qshare-vcore.sock").exists()


def test_the_plugin_registers_again_when_a_restarted_kubelet_empties_its_directory(
    plugin: DevicePlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    kubelet.close()  # the kubelet stops ...
    shutil.rmtree(settings.device_plugin_dir)  # ... and its restart empties the directory
    settings.device_plugin_dir.mkdir()
    restarted = KubeletDouble()
    restarted.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    try:
        wait_for(lambda: len(restarted.device_plugins) == 2)
        assert (settings.device_plugin_dir / "qshare-vcore.sock").exists()
        stream = restarted.list_and_watch(settings.device_plugin_dir / "qshare-vcore.sock")
        assert len(next(stream).devices) == 200
    finally:
        restarted.close()


def test_list_and_watch_advertises_each_cards_capacity(
    plugin: DevicePlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    cores = next(kubelet.list_and_watch(settings.device_plugin_dir / "qshare-vcore.sock"))
    memory = next(kubelet.list_and_watch(settings.device_plugin_dir / "qshare-vmemory.sock"))
    assert len(cores.devices) == 2 * 100
    assert len(memory.devices) == 2 * 16384 // 256
    assert {d.health for d in cores.devices} == {"Healthy"}
    assert cores.devices[150].topology.nodes[0].ID == 1


def test_list_and_watch_sends_a_new_list_when_a_card_turns_unhealthy(
    plugin: DevicePlugin, kubelet: KubeletDouble, settings: KubernetesSettings, backend: LocalVgpus
) -> None:
    stream = kubelet.list_and_watch(settings.device_plugin_dir / "qshare-vcore.sock")
    next(stream)
    backend.set_health(1, False)
    update = next(stream)
    unhealthy = {d.ID.rsplit("-c", 1)[0] for d in update.devices if d.health == "Unhealthy"}
    assert unhealthy == {CARDS[1].uuid}


def test_allocate_gives_the_bound_pods_vgpu_environment_and_mounts(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    vgpu_id = bound_pod(apiserver, "web", vcore=30)
    [container] = allocate(kubelet, settings, 30).container_responses
    prepared = backend.prepared()[f"allocator/{vgpu_id}"]
    assert container.envs["QSHARE_VGPU"] == str(prepared.vgpu_id)
    assert container.envs["CUDA_VISIBLE_DEVICES"] == CARDS[0].uuid
    assert container.envs["LD_PRELOAD"] == "/usr/lib/qshare/libqshare-cuda.so"
    attach = f".v{prepared.vgpu_id}"
    assert any(m.container_path.endswith(attach) for m in container.mounts)
    pod = apiserver.objects["/api/v1/namespaces/default/pods/web"]
    assert pod["metadata"]["annotations"]["qshare.io/allocated"].startswith(f"{NODE}/")


def test_concurrent_allocations_take_different_pods(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    ids = {bound_pod(apiserver, f"p{i}", vcore=20, bind_time=str(i)) for i in range(4)}
    replies: list[Any] = []
    threads = [
        threading.Thread(target=lambda: replies.append(allocate(kubelet, settings, 20)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    vgpus = {r.container_responses[0].envs["QSHARE_VGPU"] for r in replies}
    assert len(vgpus) == 4
    assert {k.removeprefix("allocator/") for k in backend.prepared()} == ids


def test_a_lost_answer_to_the_take_still_takes_that_pod_and_no_other(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    first = bound_pod(apiserver, "first", vcore=20, bind_time="1")
    bound_pod(apiserver, "second", vcore=20, bind_time="2")
    apiserver.lose_patch_answers = 1  # applied, then the connection drops: the client retries
    [container] = allocate(kubelet, settings, 20).container_responses
    assert list(backend.prepared()) == [f"allocator/{first}"]
    assert container.envs["QSHARE_VGPU"] == str(backend.prepared()[f"allocator/{first}"].vgpu_id)
    notes = {
        name: apiserver.objects[f"/api/v1/namespaces/default/pods/{name}"]["metadata"][
            "annotations"
        ]
        for name in ("first", "second")
    }
    assert "qshare.io/allocated" in notes["first"]
    assert "qshare.io/allocated" not in notes["second"]


def test_a_pod_deleted_before_its_take_lands_leaves_the_take_to_the_next_pod(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    bound_pod(apiserver, "first", vcore=20, bind_time="1")
    second = bound_pod(apiserver, "second", vcore=20, bind_time="2")
    first_path = "/api/v1/namespaces/default/pods/first"

    def delete_first(path: str) -> None:  # deleted after the list, before the PATCH
        if path == first_path and first_path in apiserver.objects:
            apiserver.delete_object(first_path)

    apiserver.before_patch = delete_first
    [container] = allocate(kubelet, settings, 20).container_responses
    assert list(backend.prepared()) == [f"allocator/{second}"]
    assert container.envs["QSHARE_VGPU"] == str(backend.prepared()[f"allocator/{second}"].vgpu_id)


def test_allocate_without_a_bound_pod_fails_with_a_clear_reason(
    plugin: DevicePlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        allocate(kubelet, settings, 30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on node node-a bound by the qshare extender asks for 30" in err.value.details()


def test_the_sweep_releases_vgpus_of_finished_pods(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    vgpu_id = bound_pod(apiserver, "batch", vcore=10)
    allocate(kubelet, settings, 10)
    assert plugin.sweep() == []
    apiserver.objects["/api/v1/namespaces/default/pods/batch"]["status"]["phase"] = "Succeeded"
    assert plugin.sweep() == [f"allocator/{vgpu_id}"]
    assert backend.prepared() == {}


def test_the_sweep_keeps_a_vgpu_prepared_after_its_list_of_pods(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """A pod bound after the sweep listed the node's pods, and allocated before the sweep
    looked at what is prepared, is not taken for gone."""
    listed = plugin.api.pods_on_node

    def list_then_bind_and_allocate(node: str) -> list[dict[str, Any]]:
        before = listed(node)
        plugin.api.pods_on_node = listed  # type: ignore[method-assign]
        bound_pod(apiserver, "late", vcore=10)
        allocate(kubelet, settings, 10)
        return before

    plugin.api.pods_on_node = list_then_bind_and_allocate  # type: ignore[method-assign]
    assert plugin.sweep() == []
    assert len(backend.prepared()) == 1


def test_the_take_names_the_pod_instance_and_version_it_read(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    bound_pod(apiserver, "web", vcore=10)
    read = apiserver.objects["/api/v1/namespaces/default/pods/web"]["metadata"]
    uid, version = read["uid"], read["resourceVersion"]
    seen: list[dict[str, Any]] = []
    patch = apiserver.patch

    def recording(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        seen.append(body["metadata"])
        return patch(path, body)

    apiserver.patch = recording  # type: ignore[method-assign]
    allocate(kubelet, settings, 10)
    assert [(m["uid"], m["resourceVersion"]) for m in seen] == [(uid, version)]


def test_a_pod_whose_vgpus_are_another_nodes_is_not_taken(
    plugin: DevicePlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """A pod bound here although its claim was placed on another node (another binder won
    the race) is not given a vGPU on this node's card by its annotation."""
    bound_pod(apiserver, "stray", vcore=10)
    path = "/api/v1/namespaces/default/pods/stray"
    notes = apiserver.objects[path]["metadata"]["annotations"]
    [vgpu] = json.loads(notes["qshare.io/vgpus"])
    notes["qshare.io/vgpus"] = json.dumps([dict(vgpu, node="node-z")])
    with pytest.raises(grpc.RpcError) as err:
        allocate(kubelet, settings, 10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert backend.prepared() == {}


H100_MIB = 81_559  # what NVML reports for an 80 GB H100


def test_the_default_vmemory_unit_lists_a_node_of_eight_80_gib_cards_within_the_kubelets_limit(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: KubeApi
) -> None:
    """At 1 MiB a unit, one such card alone listed 81,559 devices (5.2 MB), which the
    kubelet's 4 MiB gRPC limit refuses: the device plugin path failed on a single H100."""
    default_unit = KubernetesSettings.model_fields["vmemory_unit_mib"].default
    plugin = DevicePlugin(settings.model_copy(update={"vmemory_unit_mib": default_unit}),
                          backend, kube_api)  # fmt: skip
    cards = [CardInfo(i, f"GPU-{i}", "H100", H100_MIB, True, 0, "best-effort") for i in range(8)]
    devices = plugin._memory_devices(cards)
    response = wire.api(wire.DEVICE_PLUGIN).message("ListAndWatchResponse", devices=devices)
    assert response.ByteSize() <= KUBELET_MAX_MESSAGE


def test_a_device_list_over_the_kubelets_limit_is_logged_with_the_unit_to_set(
    plugin: DevicePlugin, caplog: pytest.LogCaptureFixture
) -> None:
    plugin.vmemory._check_size(3 * KUBELET_MAX_MESSAGE)
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "QSHARE_K8S_VMEMORY_UNIT_MIB" in record.getMessage()
    assert "at least 768" in record.getMessage()  # three times the 256 MiB unit in force
