"""The DRA kubelet plugin, driven over its unix sockets as the kubelet drives it."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qshare_node_agent.kubernetes import wire
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, LocalVgpus
from qshare_node_agent.kubernetes.slice_watch import SliceWatch

from .conftest import (
    CARDS,
    DRIVER,
    NODE,
    resource_claim,
    store_claim,
    validate_cdi,
    validate_kubernetes,
    wait_for,
)
from .doubles import ApiServerDouble, KubeletDouble

SLICE = "/apis/resource.k8s.io/v1/resourceslices/node-a-qshare-io"
MIB = 1 << 20


def prepare_one(
    kubelet: KubeletDouble, settings: KubernetesSettings, claim: tuple[str, str, str], **kw: Any
) -> Any:
    return kubelet.prepare(settings.dra_socket, [claim], **kw).claims[claim[2]]


def test_kubelet_registers_the_plugin_as_a_dra_driver(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    info = kubelet.register_plugin(settings.registration_socket)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(settings.dra_socket))
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert dra.registration.registered.is_set()


def test_stopping_the_plugin_twice_is_harmless(
    dra: DraPlugin, settings: KubernetesSettings
) -> None:
    dra.stop()
    dra.stop()
    assert not settings.dra_socket.exists()


def test_a_refused_registration_is_recorded_with_the_kubelets_reason(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    kubelet.register_plugin(settings.registration_socket, accept=False)
    assert not dra.registration.registered.is_set()
    assert dra.registration.error == "refused by the test kubelet"


def test_plugin_serves_its_sockets_again_after_the_kubelet_empties_the_directories(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    shutil.rmtree(settings.registry_dir)
    shutil.rmtree(settings.plugin_dir)
    wait_for(lambda: settings.registration_socket.exists() and settings.dra_socket.exists())
    info = kubelet.register_plugin(settings.registration_socket)
    assert info.name == DRIVER
    reply = kubelet.unprepare(settings.dra_socket, [("default", "none", "uid-x")])
    assert reply.claims["uid-x"].error == ""


def test_the_published_resource_slice_is_valid_and_describes_every_card(
    dra: DraPlugin, apiserver: ApiServerDouble
) -> None:
    wait_for(lambda: SLICE in apiserver.objects)
    published = apiserver.objects[SLICE]
    validate_kubernetes(published)
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] for d in devices)
    assert devices[1]["capacity"]["memory"]["value"] == "16384Mi"
    assert devices[1]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"] == "1024Mi"
    assert devices[1]["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] == "100"
    assert [d["capacity"]["cores"]["value"] for d in devices] == ["100", "100"]  # each card's own
    assert devices[1]["attributes"]["uuid"] == {"string": CARDS[1].uuid}
    assert devices[1]["attributes"]["numaNode"] == {"int": 1}


def test_the_slice_is_republished_when_a_card_turns_unhealthy(
    dra: DraPlugin, backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    wait_for(lambda: SLICE in apiserver.objects)
    backend.set_health(1, False)
    wait_for(lambda: apiserver.objects[SLICE]["spec"]["pool"]["generation"] >= 2)
    devices = apiserver.objects[SLICE]["spec"]["devices"]
    assert devices[1]["attributes"]["healthy"] == {"bool": False}
    validate_kubernetes(apiserver.objects[SLICE])


def test_the_slice_is_republished_when_a_cards_policy_changes(
    dra: DraPlugin, backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    wait_for(lambda: SLICE in apiserver.objects)
    backend.set_policy(0, "fixed-share")
    wait_for(
        lambda: (
            apiserver.objects[SLICE]["spec"]["devices"][0]["attributes"]["policy"]
            == {"string": "fixed-share"}
        )
    )


def test_prepare_makes_the_vgpu_and_answers_with_a_valid_cdi_device(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    claim = store_claim(apiserver, resource_claim("infer", parameters={"priority": "high"}))
    answer = prepare_one(kubelet, settings, claim)
    assert answer.error == ""
    [device] = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"],
        NODE,
        "gpu-0",
    )
    [vgpu] = backend.prepared().values()
    assert (vgpu.priority.value, vgpu.core_share, vgpu.memory_mib) == ("high", 30, 4096)
    spec = json.loads(dra.cdi.path(f"claim_{claim[2]}").read_text())
    validate_cdi(spec)
    assert list(device.cdi_device_ids) == [f"qshare.io/vgpu={spec['devices'][0]['name']}"]
    env = spec["devices"][0]["containerEdits"]["env"]
    assert f"QSHARE_VGPU={vgpu.vgpu_id}" in env
    assert f"QSHARE_VISIBLE_0={CARDS[0].uuid}" in env
    assert not [item for item in env if item.startswith("CUDA_VISIBLE_DEVICES=")]


def test_the_v1beta1_service_prepares_too(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    claim = store_claim(apiserver, resource_claim("beta"))
    answer = prepare_one(kubelet, settings, claim, version=wire.DRA_V1BETA1)
    assert answer.error == ""
    assert answer.devices[0].device_name == "gpu-0"


def test_the_slice_is_published_again_after_the_kubelet_wipes_it(
    dra: DraPlugin, apiserver: ApiServerDouble
) -> None:
    # a starting kubelet deletes its node's ResourceSlices before any plugin registers
    wait_for(lambda: SLICE in apiserver.objects)
    generation = apiserver.objects[SLICE]["spec"]["pool"]["generation"]
    apiserver.delete_object(SLICE)
    wait_for(lambda: SLICE in apiserver.objects)
    assert apiserver.objects[SLICE]["spec"]["pool"]["generation"] > generation


def test_a_slice_already_gone_when_the_watch_first_lists_is_published_again(
    kube_api: KubeApi,
) -> None:
    """The plugin publishes before its watch first lists: a kubelet wiping the slice in
    between leaves nothing for the watch to see but the slice's absence."""
    gone = threading.Event()
    watch = SliceWatch(kube_api, SLICE.rsplit("/", 1)[1], gone.set, watch_s=1)
    watch.start()
    try:
        assert gone.wait(20)
    finally:
        watch.stop()


def test_a_v1_answer_names_the_allocated_share_of_each_device(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    body = resource_claim("shared")
    share = body["status"]["allocation"]["devices"]["results"][0]["shareID"]
    answer = prepare_one(kubelet, settings, store_claim(apiserver, body))
    assert answer.error == ""
    assert answer.devices[0].share_id == share


def test_a_v1_answer_names_no_share_for_a_device_allocated_without_one(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    body = resource_claim("unshared")
    del body["status"]["allocation"]["devices"]["results"][0]["shareID"]
    answer = prepare_one(kubelet, settings, store_claim(apiserver, body))
    assert answer.error == ""
    assert not answer.devices[0].HasField("share_id")


def test_prepare_is_idempotent(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    claim = store_claim(apiserver, resource_claim("again"))
    first = prepare_one(kubelet, settings, claim)
    second = prepare_one(kubelet, settings, claim)
    assert first == second
    assert len(backend.prepared()) == 1


def test_unprepare_releases_the_vgpu_and_its_cdi_spec_and_is_idempotent(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    claim = store_claim(apiserver, resource_claim("done"))
    prepare_one(kubelet, settings, claim)
    vgpu_id = next(iter(backend.prepared().values())).vgpu_id
    for _ in range(2):
        reply = kubelet.unprepare(settings.dra_socket, [claim])
        assert reply.claims[claim[2]].error == ""
    assert backend.prepared() == {}
    assert not dra.cdi.path(f"claim_{claim[2]}").exists()
    with pytest.raises(LookupError):
        backend._node.vgpu_stats(vgpu_id)


def test_each_claim_gets_its_own_answer_and_an_unknown_claim_fails_alone(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    good = store_claim(apiserver, resource_claim("good"))
    unknown = ("default", "ghost", "uid-ghost")
    reply = kubelet.prepare(settings.dra_socket, [good, unknown])
    assert reply.claims[good[2]].error == ""
    assert "ResourceClaim default/ghost does not exist" in reply.claims["uid-ghost"].error


BAD_CLAIMS = {
    "zero cores": (dict(consumed={"memory": "4Gi", "cores": "0"}), "cores must be 1-100, got 0"),
    "101 cores": (dict(consumed={"memory": "4Gi", "cores": "101"}), "cores must be 1-100, got 101"),
    "memory under the minimum": (
        dict(consumed={"memory": "512Mi", "cores": "10"}),
        "memory must be 1024-16384 MiB, got 512 MiB",
    ),
    "unknown device": (dict(device="gpu-7"), "device 'gpu-7' is not on this node"),
    "malformed opaque config": (
        dict(parameters={"priority": "urgent"}),
        "opaque config of request 'gpu': priority",
    ),
    "config that is not an object": (dict(parameters=["high"]), "is not a JSON object"),
    "another node": (dict(node="node-b"), "allocated to node ['node-b'], not node-a"),
}


@pytest.mark.parametrize("case", BAD_CLAIMS, ids=list(BAD_CLAIMS))
def test_a_bad_claim_gets_a_clear_error_and_nothing_is_prepared(
    case: str,
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    kwargs, message = BAD_CLAIMS[case]
    claim = store_claim(apiserver, resource_claim("bad", **kwargs))
    answer = prepare_one(kubelet, settings, claim)
    assert message in answer.error
    assert backend.prepared() == {}
    assert not dra.cdi.path(f"claim_{claim[2]}").exists()
    good = store_claim(apiserver, resource_claim("after"))
    assert prepare_one(kubelet, settings, good).error == ""


def test_a_claim_failing_on_its_second_device_gives_back_the_first(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    body = resource_claim("two")
    first = body["status"]["allocation"]["devices"]["results"][0]
    second = dict(first, device="gpu-1", shareID="s2", consumedCapacity={"memory": "32Gi"})
    body["status"]["allocation"]["devices"]["results"].append(second)
    answer = prepare_one(kubelet, settings, store_claim(apiserver, body))
    assert "memory must be 1024-16384 MiB" in answer.error
    assert backend.prepared() == {}


def test_a_restarted_plugin_keeps_prepared_claims(
    settings: KubernetesSettings,
    kubelet: KubeletDouble,
    apiserver: ApiServerDouble,
    kube_api: Any,
    short_dir: Path,
) -> None:
    from .conftest import make_node

    node = make_node(short_dir, "restart-test")
    first = LocalVgpus(node, CARDS)
    plugin = DraPlugin(settings, first, kube_api)
    plugin.start()
    claim = store_claim(apiserver, resource_claim("kept"))
    before = prepare_one(kubelet, settings, claim)
    vgpu_id = next(iter(first.prepared().values())).vgpu_id
    plugin.stop()
    node.close()  # the agent went away with its segment

    node = make_node(short_dir, "restart-test")  # a new agent, a new segment
    second = LocalVgpus(node, CARDS)
    assert second.restore() == []
    again = DraPlugin(settings, second, kube_api)
    again.start()
    try:
        assert prepare_one(kubelet, settings, claim) == before
        assert node.vgpu_stats(vgpu_id).mem_limit == 4096 * MIB
        assert vgpu_id >= FIRST_LOCAL_ID
    finally:
        again.stop()
        node.close()


def test_the_claims_these_tests_prepare_are_valid_resource_claims() -> None:
    claim = resource_claim("shape", parameters={"priority": "high"})
    validate_kubernetes(claim)


def test_a_claim_shaped_unlike_any_resource_claim_fails_alone(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    odd = resource_claim("odd")
    odd["status"]["allocation"]["devices"]["results"] = ["not an object"]
    bad, good = store_claim(apiserver, odd), store_claim(apiserver, resource_claim("fine"))
    reply = kubelet.prepare(settings.dra_socket, [bad, good])
    assert "cannot be read" in reply.claims[bad[2]].error
    assert reply.claims[good[2]].error == ""
    assert len(backend.prepared()) == 1


def test_a_restarted_plugin_publishes_a_later_pool_generation(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: Any, apiserver: ApiServerDouble
) -> None:
    first = DraPlugin(settings, backend, kube_api)
    for _ in range(3):
        first.publish()
    again = DraPlugin(settings, backend, kube_api)
    again.publish()
    assert apiserver.objects[SLICE]["spec"]["pool"]["generation"] == 4


def test_a_policy_hint_sets_the_policy_of_a_card_with_no_vgpus(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    hinted = resource_claim("hinted", device="gpu-1", parameters={"policy": "fs"})
    answer = prepare_one(kubelet, settings, store_claim(apiserver, hinted))
    assert answer.error == ""
    assert backend.cards()[1].policy == "fixed-share"
    wait_for(lambda: SLICE in apiserver.objects)  # the first publication may come later
    wait_for(
        lambda: (
            apiserver.objects[SLICE]["spec"]["devices"][1]["attributes"]["policy"]
            == {"string": "fixed-share"}
        )
    )


def test_a_policy_hint_for_a_card_running_vgpus_under_another_policy_is_refused(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    assert (
        prepare_one(kubelet, settings, store_claim(apiserver, resource_claim("first"))).error == ""
    )
    hinted = store_claim(apiserver, resource_claim("hinted", parameters={"policy": "burst-share"}))
    answer = prepare_one(kubelet, settings, hinted)
    assert "card 0 runs best-effort with 1 other vGPU(s)" in answer.error
    assert "policy burst-share can only be set on a card with no vGPUs" in answer.error
    assert len(backend.prepared()) == 1
    assert backend.cards()[0].policy == "best-effort"


def test_a_claim_refused_on_a_later_device_gives_the_card_back_its_policy(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    cores = {"memory": "4Gi", "cores": "60"}
    body = resource_claim("two", consumed=cores, parameters={"policy": "fixed-share"})
    first = body["status"]["allocation"]["devices"]["results"][0]
    body["status"]["allocation"]["devices"]["results"].append(dict(first, shareID="s2"))
    answer = prepare_one(kubelet, settings, store_claim(apiserver, body))
    assert "low-priority core shares would sum to 120" in answer.error
    assert backend.prepared() == {}
    assert backend.cards()[0].policy == "best-effort"


def test_a_policy_hint_matching_the_cards_policy_joins_its_vgpus(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    assert (
        prepare_one(kubelet, settings, store_claim(apiserver, resource_claim("first"))).error == ""
    )
    same = store_claim(apiserver, resource_claim("same", parameters={"policy": "best-effort"}))
    assert prepare_one(kubelet, settings, same).error == ""
    assert len(backend.prepared()) == 2


def test_a_socket_that_cannot_be_served_again_at_once_is_retried_until_it_can(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    """The kubelet's directories can be in flux while it restarts: a failed attempt to serve
    the socket again is retried, and the plugin does not stay gone."""
    shutil.rmtree(settings.plugin_dir)
    settings.plugin_dir.write_text("not a directory yet")
    time.sleep(10 * settings.socket_check_s)  # attempts to serve again fail meanwhile
    settings.plugin_dir.unlink()
    wait_for(settings.dra_socket.exists)
    reply = kubelet.unprepare(settings.dra_socket, [("default", "none", "uid-x")])
    assert reply.claims["uid-x"].error == ""


def test_a_claim_named_twice_in_one_request_is_answered_once(
    dra: DraPlugin, kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    claim = store_claim(apiserver, resource_claim("twice"))
    reply = kubelet.prepare(settings.dra_socket, [claim, claim])
    assert reply.claims[claim[2]].error == ""
    assert [d.device_name for d in reply.claims[claim[2]].devices] == ["gpu-0"]
