"""A request with a prioritized list (`firstAvailable`) is allocated under a subrequest, which
the allocation names `<request>/<subrequest>`; a config naming the main request applies to
every one of its subrequests (as the ResourceClaim API says), one naming a subrequest to that
one only."""

from __future__ import annotations

from typing import Any

from qshare_node_agent.kubernetes import wire
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import resource_claim, store_claim, validate_kubernetes, wait_for
from .doubles import ApiServerDouble, KubeletDouble


def prioritized(name: str, targets: list[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """A claim whose request `gpu` lists `small` then `large`, allocated under `small`, with
    one config for `targets`."""
    claim = resource_claim(name, parameters=parameters)
    request = claim["spec"]["devices"]["requests"][0]
    exactly = request.pop("exactly")
    request["firstAvailable"] = [
        {"name": "small", **exactly},
        {"name": "large", **exactly, "capacity": {"requests": {"memory": "8Gi", "cores": "60"}}},
    ]
    devices = claim["status"]["allocation"]["devices"]
    devices["results"][0]["request"] = "gpu/small"
    devices["config"][0]["requests"] = targets
    return claim


def test_the_prioritized_claims_are_valid_resource_claims() -> None:
    for targets in (["gpu"], ["gpu/small"]):
        validate_kubernetes(prioritized("shape", targets, {"priority": "high"}))


def prepared_priority(
    claim: dict[str, Any],
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> str:
    ref = store_claim(apiserver, claim)
    wait_for(lambda: dra.claims.holds(*ref))
    answer = kubelet.prepare(settings.dra_socket, [ref]).claims[ref[2]]
    assert answer.error == ""
    [vgpu] = backend.prepared().values()
    return vgpu.priority.value


def test_a_config_naming_the_main_request_applies_to_its_allocated_subrequest(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """Before: the config was compared with `gpu/small` as a whole and skipped, so the
    claim's priority (and policy) were silently dropped: a low-priority vGPU."""
    claim = prioritized("main", ["gpu"], {"priority": "high"})
    assert prepared_priority(claim, dra, kubelet, settings, apiserver, backend) == "high"


def test_a_config_naming_the_subrequest_applies_to_it(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """Guard: the full `<request>/<subrequest>` name matched before too."""
    claim = prioritized("sub", ["gpu/small"], {"priority": "high"})
    assert prepared_priority(claim, dra, kubelet, settings, apiserver, backend) == "high"


def test_a_config_naming_another_subrequest_does_not_apply(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """Guard: the config of `gpu/large` is not the allocated `gpu/small`'s."""
    claim = prioritized("other", ["gpu/large"], {"priority": "high"})
    assert prepared_priority(claim, dra, kubelet, settings, apiserver, backend) == "low"


def test_a_device_allocated_under_a_subrequest_reaches_the_container_naming_its_request(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """A container names the claim's request (`gpu`), whichever subrequest was allocated, and
    the kubelet hands it the devices whose `request_names` hold that name as it is. Before,
    the answer said `gpu/small`: the container got no CDI device, so no vGPU."""
    ref = store_claim(apiserver, prioritized("reach", ["gpu"], {"priority": "high"}))
    wait_for(lambda: dra.claims.holds(*ref))
    for version in (wire.DRA_V1, wire.DRA_V1BETA1):
        answer = kubelet.prepare(settings.dra_socket, [ref], version=version).claims[ref[2]]
        assert answer.error == ""
        [device] = answer.devices
        assert list(device.request_names) == ["gpu"]
        assert kubelet.container_cdi_devices(answer, "gpu") == list(device.cdi_device_ids)
