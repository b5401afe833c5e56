"""Pods sharing one ResourceClaim: the kubelet may prepare (and unprepare) the same claim
from several calls at once, each pod's sandbox or a retry. The plugin serves one call per
claim at a time, so a later call answers what the first left (its vGPUs, or afresh after
its failure) and one call's failure never undoes another's answered success.

`HeldSave` is a test double over the real backend: its armed save waits for the test and
then fails as a full disk would (no real disk fails on demand); everything else is real."""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, resource_claim, store_claim, wait_for
from .doubles import ApiServerDouble, KubeletDouble

Claim = tuple[str, str, str]


class HeldSave(LocalVgpus):
    """The real backend; once `armed`, its next save waits for `go_on`, then fails (or,
    with `fails` False, saves). `steps` says, in order, when the held save ended and when a
    vGPU was released: what the server did, whatever order its answers reach the client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed = False
        self.fails = True
        self.arrived = threading.Event()
        self.go_on = threading.Event()
        self.steps: list[str] = []

    def save(self) -> None:
        if self.armed:
            self.armed = False
            self.arrived.set()
            self.go_on.wait(20)
            self.steps.append("held save ended")
            if self.fails:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
        super().save()

    def release(self, key: str, *, durable: bool = True) -> None:
        self.steps.append("release")
        super().release(key, durable=durable)


@pytest.fixture
def held(node: Any) -> HeldSave:
    return HeldSave(node, CARDS, min_vgpu_mib=1024)


@pytest.fixture
def plugin(settings: KubernetesSettings, held: HeldSave, kube_api: KubeApi) -> Iterator[DraPlugin]:
    dra = DraPlugin(settings, held, kube_api)
    dra.start()
    yield dra
    held.go_on.set()
    dra.stop()


def read_from_the_api(dra: DraPlugin, apiserver: ApiServerDouble, name: str) -> Claim:
    """A stored claim the plugin's cache does not serve: each prepare reads it from the API
    server, in a thread of its own (the path where calls ran side by side)."""
    claim = store_claim(apiserver, resource_claim(name))
    wait_for(lambda: dra.claims.holds(*claim))
    dra.claims.forget(claim[2])
    assert not dra.claims.holds(*claim)
    return claim


class Call(threading.Thread):
    """One kubelet call of `prepare` or `unprepare` for `claim`, its answer kept."""

    def __init__(self, kubelet: KubeletDouble, verb: str, socket: Any, claim: Claim) -> None:
        super().__init__(daemon=True)
        self.verb, self.socket, self.claim = verb, socket, claim
        self.kubelet = kubelet
        self.answer: Any = None

    def run(self) -> None:
        method = getattr(self.kubelet, self.verb)
        self.answer = method(self.socket, [self.claim]).claims[self.claim[2]]


def spec_devices(dra: DraPlugin, uid: str) -> set[str]:
    """The CDI device ids the claim's spec names (none without a spec)."""
    path = dra.cdi.path(f"claim_{uid}")
    if not path.exists():
        return set()
    return {f"qshare.io/vgpu={d['name']}" for d in json.loads(path.read_text())["devices"]}


def beside_a_held_save(
    kubelet: KubeletDouble, socket: Any, held: HeldSave, claim: Claim, verbs: tuple[str, str]
) -> tuple[Call, Call]:
    """The first call of `verbs` made the claim's vGPU and waits in its armed save; the second
    comes meanwhile and has 2 s to be answered (before: it was; now: it waits for the
    first); then the save goes on. Both calls, answered."""
    first = Call(kubelet, verbs[0], socket, claim)
    first.start()
    assert held.arrived.wait(10)
    second = Call(kubelet, verbs[1], socket, claim)
    second.start()
    second.join(2)
    held.go_on.set()
    first.join(15)
    second.join(15)
    return first, second


def device_ids(call: Call) -> set[str]:
    """The CDI device ids a prepare was answered with."""
    return {i for d in call.answer.devices for i in d.cdi_device_ids}


def test_a_prepare_failing_beside_another_of_the_same_claim_never_undoes_its_success(
    plugin: DraPlugin,
    held: HeldSave,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """The first prepare made the claim's vGPU and waits in its save, which will fail. Before,
    the second found the vGPU made, wrote the spec again, saved and answered OK; then the
    first's failure gave back the vGPU and removed the spec: a pod was told to run on a
    vGPU that no longer existed. Now the second waits, then prepares afresh."""
    claim = read_from_the_api(plugin, apiserver, "shared")
    held.armed = True
    verbs = ("prepare", "prepare")
    first, second = beside_a_held_save(kubelet, settings.dra_socket, held, claim, verbs)
    assert "No space left on device" in first.answer.error
    assert second.answer.error == ""
    assert device_ids(second) and device_ids(second) == spec_devices(plugin, claim[2])
    prepared = [v for k, v in held.prepared().items() if k.startswith(f"dra/{claim[2]}/")]
    assert len(prepared) == 1
    assert held._node.list_vgpus() == [prepared[0].vgpu_id]


def test_concurrent_prepares_of_one_claim_make_one_vgpu_and_answer_it_alike(
    plugin: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    held: HeldSave,
) -> None:
    """Six calls at once, each reading the claim from the API server. Before, they wrote the
    spec side by side through one temporary file, and some failed (five runs in six)."""
    claim = read_from_the_api(plugin, apiserver, "shared-many")
    calls = [Call(kubelet, "prepare", settings.dra_socket, claim) for _ in range(6)]
    for call in calls:
        call.start()
    for call in calls:
        call.join(15)
    assert {c.answer.error for c in calls} == {""}
    answered = {tuple(i for d in c.answer.devices for i in d.cdi_device_ids) for c in calls}
    assert len(answered) == 1
    assert set(next(iter(answered))) == spec_devices(plugin, claim[2])
    assert len(held._node.list_vgpus()) == 1


def test_an_unprepare_beside_a_prepare_of_the_same_claim_runs_after_it(
    plugin: DraPlugin,
    held: HeldSave,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """Before, the unprepare released the vGPU the prepare had made and was answered while
    the prepare still saved; the prepare was answered OK last, naming a destroyed vGPU and
    a removed spec. Now the unprepare waits, then releases what the prepare made. (The
    order the two answers reach the kubelet double's threads is not the server's: under
    load it swapped, so the server's own steps are what is checked.)"""
    claim = read_from_the_api(plugin, apiserver, "leaving")
    held.armed, held.fails = True, False
    verbs = ("prepare", "unprepare")
    prepare, unprepare = beside_a_held_save(kubelet, settings.dra_socket, held, claim, verbs)
    assert (prepare.answer.error, unprepare.answer.error) == ("", "")
    assert held.steps == ["held save ended", "release"]
    assert held.prepared() == {} and held._node.list_vgpus() == []
    assert spec_devices(plugin, claim[2]) == set()


def test_a_prepare_the_kubelet_gave_up_on_still_holds_its_claim_until_its_work_ends(
    plugin: DraPlugin,
    held: HeldSave,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """A call past its deadline has its work go on (it saves, or fails and gives back); the
    claim stays its own until then, or its failure would undo the next call's success as
    above. grpc.aio sometimes cancels the handler at the deadline: this failed under load
    (`make test`) until the work ran in a task of its own (`ClaimLocks.run_holding`, whose
    test shows it deterministically)."""
    claim = read_from_the_api(plugin, apiserver, "impatient")
    held.armed = True
    api, calls = kubelet.dra(settings.dra_socket)
    request = api.message("NodePrepareResourcesRequest")
    request.claims.add(namespace=claim[0], name=claim[1], uid=claim[2])
    with pytest.raises(grpc.RpcError) as gave_up:
        calls["NodePrepareResources"](request, timeout=0.5)
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert held.arrived.wait(20)  # the work goes on past the deadline, however loaded the host
    second = Call(kubelet, "prepare", settings.dra_socket, claim)
    second.start()
    second.join(2)  # waits for the first call's thread
    held.go_on.set()
    second.join(15)
    assert second.answer.error == ""
    assert device_ids(second) and device_ids(second) == spec_devices(plugin, claim[2])
    assert len(held._node.list_vgpus()) == 1
