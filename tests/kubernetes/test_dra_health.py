"""An unhealthy card, as Kubernetes sees it: its device tainted `qshare.io/unhealthy` in the
ResourceSlice (no new claims on it) until it heals, and its health streamed to the kubelet
over the real DRA resource-health gRPC service (v1 and v1alpha1) on the DRA socket, for the
pods' status. The cards are the simulated ones; the kubelet and API server are doubles."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from qshare_node_agent.kubernetes import wire
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.backend import CardInfo
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes.resourceslice import UnhealthySince

from .conftest import CARDS, NODE, validate_kubernetes, wait_for
from .doubles import ApiServerDouble, KubeletDouble

SLICE = "/apis/resource.k8s.io/v1/resourceslices/node-a-qshare-io"
HEALTH = [wire.DRA_HEALTH_V1, wire.DRA_HEALTH_V1ALPHA1]


def health_of(response: Any) -> dict[str, str]:
    """Device name -> health name, of one NodeWatchResourcesResponse."""
    enum = response.DESCRIPTOR.fields_by_name["devices"].message_type.fields_by_name["health"]
    names = {v.number: v.name for v in enum.enum_type.values}
    return {d.device.device_name: names[d.health] for d in response.devices}


def next_until(stream: Iterator[Any], wanted: Callable[[Any], bool]) -> Any:
    """The first message of `stream` that is `wanted` (the call's own timeout bounds it)."""
    for response in stream:
        if wanted(response):
            return response
    raise AssertionError("the health stream ended")


@pytest.mark.parametrize("version", HEALTH)
def test_the_kubelet_sees_a_card_go_unhealthy_and_heal(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    backend: LocalVgpus,
    version: str,
) -> None:
    stream = kubelet.watch_health(settings.dra_socket, version)
    first = next(stream)
    assert health_of(first) == {"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}
    assert {d.device.pool_name for d in first.devices} == {NODE}
    assert all(abs(d.last_updated_time - time.time()) < 60 for d in first.devices)
    backend.set_health(1, False)
    sick = next_until(stream, lambda r: health_of(r)["gpu-1"] == "UNHEALTHY")
    assert health_of(sick)["gpu-0"] == "HEALTHY"
    assert CARDS[1].uuid in sick.devices[1].message
    backend.set_health(1, True)
    healed = next_until(stream, lambda r: health_of(r)["gpu-1"] == "HEALTHY")
    assert healed.devices[1].message == ""
    stream.cancel()


@pytest.fixture
def plugin_with(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: KubeApi
) -> Iterator[Callable[..., DraPlugin]]:
    """A DRA plugin started with `settings` changed as asked."""
    started: list[DraPlugin] = []

    def start(**changes: Any) -> DraPlugin:
        plugin = DraPlugin(settings.model_copy(update=changes), backend, kube_api)
        plugin.start()
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.stop()


def test_the_stream_repeats_every_cards_health_unchanged(
    plugin_with: Callable[..., DraPlugin], kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    """The kubelet counts a device it has not heard of for 30 s as Unknown."""
    plugin_with(health_resend_s=0.05)
    stream = kubelet.watch_health(settings.dra_socket, timeout=10)
    repeated = [health_of(next(stream)) for _ in range(3)]
    assert repeated == [{"gpu-0": "HEALTHY", "gpu-1": "HEALTHY"}] * 3
    stream.cancel()


def test_the_health_service_turned_off_is_neither_listed_nor_served(
    plugin_with: Callable[..., DraPlugin], kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    plugin_with(health_service=False)
    info = kubelet.register_plugin(settings.registration_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    with pytest.raises(grpc.RpcError) as refused:
        next(kubelet.watch_health(settings.dra_socket, timeout=5))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def devices(apiserver: ApiServerDouble) -> list[dict[str, Any]]:
    return list(apiserver.objects.get(SLICE, {}).get("spec", {}).get("devices", []))


def test_an_unhealthy_cards_device_is_tainted_until_it_heals(
    dra: DraPlugin, backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    wait_for(lambda: len(devices(apiserver)) == 2)
    assert all("taints" not in d for d in devices(apiserver))
    backend.set_health(1, False)
    wait_for(lambda: "taints" in devices(apiserver)[1])
    validate_kubernetes(apiserver.objects[SLICE])
    [taint] = devices(apiserver)[1]["taints"]
    assert (taint["key"], taint["effect"]) == ("qshare.io/unhealthy", "NoSchedule")
    assert "taints" not in devices(apiserver)[0]
    backend.set_health(1, True)
    wait_for(lambda: "taints" not in devices(apiserver)[1])


def test_the_taint_effect_is_a_setting(
    plugin_with: Callable[..., DraPlugin], backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    backend.set_health(0, False)
    plugin_with(unhealthy_taint_effect="NoExecute")
    wait_for(lambda: "taints" in (devices(apiserver) or [{}])[0])
    assert devices(apiserver)[0]["taints"][0]["effect"] == "NoExecute"


def test_a_taint_effect_kubernetes_does_not_know_is_refused_by_name(
    settings: KubernetesSettings,
) -> None:
    values = settings.model_dump() | {"unhealthy_taint_effect": "PreferNoSchedule"}
    with pytest.raises(ValidationError, match="unhealthy_taint_effect"):
        KubernetesSettings(**values)


def card(index: int, healthy: bool) -> CardInfo:
    return CardInfo(index, f"GPU-{index}", "Simulated H100", 16384, healthy, 0, "best-effort")


def test_a_taint_keeps_the_time_its_card_was_first_seen_unhealthy() -> None:
    """Republishing (a policy change, a wiped slice) must not date the taint anew: the API
    server would, for a taint sent without `timeAdded`."""
    now = [100.0]
    since = UnhealthySince(lambda: now[0])
    assert since.update([card(0, True), card(1, False)]) == {1: 100.0}
    now[0] = 200.0
    assert since.update([card(0, False), card(1, False)]) == {0: 200.0, 1: 100.0}
    now[0] = 300.0
    assert since.update([card(0, False), card(1, True)]) == {0: 200.0}
    assert since.update([card(0, False), card(1, False)]) == {0: 200.0, 1: 300.0}


def test_a_restarted_agent_keeps_the_date_of_a_taint_it_published_before(
    plugin_with: Callable[..., DraPlugin], backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    """Before, a restarted agent dated every taint anew, restarting the clock of a NoExecute
    toleration (`tolerationSeconds`) for a card that had been sick all along."""
    backend.set_health(1, False)
    first = plugin_with()
    wait_for(lambda: "taints" in (devices(apiserver) or [{}, {}])[1])
    first.stop()
    left = apiserver.objects[SLICE]
    left["spec"]["devices"][1]["taints"][0]["timeAdded"] = "2025-01-02T03:04:05Z"
    apiserver.put_object(SLICE, left)  # as an agent that ran back then left it
    generation = left["spec"]["pool"]["generation"]
    plugin_with()
    wait_for(lambda: apiserver.objects[SLICE]["spec"]["pool"]["generation"] > generation)
    assert devices(apiserver)[1]["taints"][0]["timeAdded"] == "2025-01-02T03:04:05Z"


def test_a_published_taint_of_a_card_now_healthy_is_not_kept(
    plugin_with: Callable[..., DraPlugin], backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    """Guard: a card that healed while the agent was down is untainted by its first publish."""
    backend.set_health(1, False)
    first = plugin_with()
    wait_for(lambda: "taints" in (devices(apiserver) or [{}, {}])[1])
    first.stop()
    backend.set_health(1, True)
    plugin_with()
    wait_for(lambda: "taints" not in devices(apiserver)[1])


def test_a_published_taint_date_that_cannot_be_read_is_dated_anew() -> None:
    """Bad input: a slice somebody edited by hand; the card is dated now, nothing raises."""
    since = UnhealthySince(lambda: 500.0)
    device = {"attributes": {"uuid": {"string": "GPU-1"}},
              "taints": [{"key": "qshare.io/unhealthy", "timeAdded": "yesterday"}]}  # fmt: skip
    since.adopt({"spec": {"devices": [device, {"taints": "none"}, "junk"]}})
    assert since.update([card(1, False)]) == {1: 500.0}


def test_stopping_the_plugin_ends_an_open_health_stream(
    plugin_with: Callable[..., DraPlugin], kubelet: KubeletDouble, settings: KubernetesSettings
) -> None:
    """Guard: a watching kubelet does not hold the plugin's stop (nor the stream hang)."""
    plugin = plugin_with()
    stream = kubelet.watch_health(settings.dra_socket, timeout=30)
    next(stream)
    started = time.monotonic()
    plugin.stop()
    assert time.monotonic() - started < 5
    with pytest.raises(grpc.RpcError) as ended:
        next(stream)
    assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
