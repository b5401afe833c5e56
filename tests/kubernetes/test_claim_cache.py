"""The DRA plugin's ResourceClaims held by LIST + WATCH against the API server double, which
speaks the real list and watch protocol (resourceVersion, newline-delimited JSON events)."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi
from qshare_node_agent.kubernetes.claim_cache import ClaimCache
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin

from .conftest import resource_claim, store_claim, wait_for
from .doubles import ApiServerDouble, KubeletDouble

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture
def cache(kube_api: KubeApi) -> Iterator[ClaimCache]:
    held = ClaimCache(kube_api, watch_s=1, retry_s=0.05)
    held.start()
    assert held.synced.wait(20)
    yield held
    held.stop()


def claim_gets(apiserver: ApiServerDouble) -> list[str]:
    return [p for m, p in apiserver.requests if m == "GET" and p.startswith(CLAIMS + "/")]


def test_a_claim_listed_at_start_is_held(apiserver: ApiServerDouble, kube_api: KubeApi) -> None:
    ns, name, uid = store_claim(apiserver, resource_claim("early"))
    held = ClaimCache(kube_api)
    held.start()
    try:
        wait_for(lambda: held.get(ns, name, uid) is not None)
    finally:
        held.stop()


def test_a_claim_allocated_after_start_arrives_by_watch(
    cache: ClaimCache, apiserver: ApiServerDouble
) -> None:
    ns, name, uid = store_claim(apiserver, resource_claim("late"))
    wait_for(lambda: cache.get(ns, name, uid) is not None)
    assert ("WATCH", "/apis/resource.k8s.io/v1/resourceclaims") in apiserver.requests


def test_a_deleted_claim_is_no_longer_held(cache: ClaimCache, apiserver: ApiServerDouble) -> None:
    ns, name, uid = store_claim(apiserver, resource_claim("gone"))
    wait_for(lambda: cache.get(ns, name, uid) is not None)
    apiserver.delete_object(f"{CLAIMS}/{name}")
    wait_for(lambda: cache.get(ns, name, uid) is None)


def test_a_claim_of_another_uid_not_allocated_or_reserved_for_no_pod_is_a_miss(
    cache: ClaimCache, apiserver: ApiServerDouble
) -> None:
    pending = resource_claim("pending")
    del pending["status"]
    unreserved = resource_claim("unreserved")
    del unreserved["status"]["reservedFor"]
    misses = [store_claim(apiserver, pending), store_claim(apiserver, unreserved)]
    other = store_claim(apiserver, resource_claim("other"))
    wait_for(lambda: cache.get(*other) is not None)
    assert [cache.get(*claim) for claim in misses] == [None, None]
    assert cache.get(other[0], other[1], "not-its-uid") is None


def test_the_cache_keeps_following_after_the_server_ends_a_watch(
    cache: ClaimCache, apiserver: ApiServerDouble
) -> None:
    time.sleep(1.3)  # the 1 s watch has ended; the cache watched again from its version
    claim = store_claim(apiserver, resource_claim("after"))
    wait_for(lambda: cache.get(*claim) is not None)


def test_a_watch_from_a_version_older_than_the_history_fails_with_410() -> None:
    server = ApiServerDouble(history=2)
    try:
        for i in range(5):
            store_claim(server, resource_claim(f"c{i}"))
        api = KubeApi(server.url)
        with pytest.raises(ApiError) as failure:
            list(api.watch_resource_claims("1", timeout_s=1))
        assert failure.value.status == 410
        items, version = api.resource_claims()
        assert (len(items), version) == (5, "5")
        api.close()
    finally:
        server.close()


def test_prepare_reads_a_held_claim_without_a_get(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    claim = store_claim(apiserver, resource_claim("cached"))
    wait_for(lambda: dra.claims.get(*claim) is not None)
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    assert claim_gets(apiserver) == []


def test_prepare_of_a_claim_not_held_yet_gets_it(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    dra.claims.stop()  # nothing new reaches the cache
    claim = store_claim(apiserver, resource_claim("uncached"))
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    assert claim_gets(apiserver) == [f"{CLAIMS}/uncached"]


def test_a_claim_dropped_from_the_cache_during_a_prepare_is_not_read_again(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claims are taken once, up front: a drop between two claims of one request (as a
    watch event can make) brings no GET, which would block the plugin's event loop."""
    first, second = (store_claim(apiserver, resource_claim(n)) for n in ("one", "two"))
    wait_for(lambda: dra.claims.holds(*first) and dra.claims.holds(*second))
    prepare = dra.backend.prepare

    def dropping_the_second(*args: Any, **kwargs: Any) -> Any:
        dra.claims.forget(second[2])
        return prepare(*args, **kwargs)

    monkeypatch.setattr(dra.backend, "prepare", dropping_the_second)
    answers = kubelet.prepare(settings.dra_socket, [first, second]).claims
    assert [answers[c[2]].error for c in (first, second)] == ["", ""]
    assert claim_gets(apiserver) == []


def test_a_cache_that_cannot_list_holds_nothing_and_stops_cleanly(
    apiserver: ApiServerDouble,
) -> None:
    dead = KubeApi("http://127.0.0.1:9")  # nothing listens: every list fails
    held = ClaimCache(dead, retry_s=0.01)
    held.start()
    try:
        ns, name, uid = store_claim(apiserver, resource_claim("unlisted"))
        time.sleep(0.1)
        assert not held.synced.is_set()
        assert held.get(ns, name, uid) is None
    finally:
        held.stop()
        dead.close()


def test_an_unprepared_claim_is_read_afresh_when_prepared_again(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    claim = store_claim(apiserver, resource_claim("again"))
    wait_for(lambda: dra.claims.get(*claim) is not None)
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert not dra.claims.holds(*claim)
    dra.claims.stop()  # the watch brings nothing new: the next prepare must GET
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert claim_gets(apiserver) == [f"{CLAIMS}/again"]


def test_a_late_event_of_an_unprepared_claims_old_allocation_is_not_trusted(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """A lagging watch can bring, after the unprepare, an event from before it: the claim
    still allocated to its old device and reserved for its old pod. Held as current, it
    would send the next prepare (the claim allocated again, to another device, for another
    pod) to the old device; the claim is read from the API server until the watch shows
    it released."""
    old = resource_claim("moved", device="gpu-0")
    claim = store_claim(apiserver, copy.deepcopy(old))
    wait_for(lambda: dra.claims.holds(*claim))
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""

    apiserver.put_object(f"{CLAIMS}/moved", copy.deepcopy(old))  # the late event
    marker = store_claim(apiserver, resource_claim("marker"))  # events arrive in order
    wait_for(lambda: dra.claims.holds(*marker))
    dra.claims.stop()  # the watch lags: the claim's later changes have not arrived
    again = copy.deepcopy(old)
    [result] = again["status"]["allocation"]["devices"]["results"]
    result["device"] = "gpu-1"
    again["status"]["reservedFor"] = [{"resource": "pods", "name": "next", "uid": "p2"}]
    apiserver.put_object(f"{CLAIMS}/moved", again)

    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["gpu-1"]
