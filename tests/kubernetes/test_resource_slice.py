"""The ResourceSlice we publish against the API server's checks of a resource.k8s.io/v1
slice (`qshare.testing.resource_slice_rules`, as the API server double applies them), and
the double refusing what a real server refuses."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from qshare.testing.resource_slice_rules import slice_errors
from qshare_node_agent.kubernetes.backend import CardInfo
from qshare_node_agent.kubernetes.resourceslice import resource_slice, unhealthy_taint

from .conftest import validate_kubernetes
from .doubles import ApiServerDouble

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MIN_MIB = 1024


def card(index: int = 0, memory_mib: int = 16384, healthy: bool = True) -> CardInfo:
    uuid = f"GPU-0a1b2c3d-0000-4000-8000-00000000000{index}"
    return CardInfo(index, uuid, "Simulated H100", memory_mib, healthy, 0, "best-effort")


def published(*cards: CardInfo) -> dict[str, Any]:
    return resource_slice("node-a", "qshare.io", list(cards), MIN_MIB, 1)


def test_our_slice_passes_the_api_servers_checks() -> None:
    assert slice_errors(published(card(0), card(1))) == []


@pytest.mark.parametrize("memory_mib", [MIN_MIB, MIN_MIB - 1, 0])
def test_a_card_too_small_for_a_step_above_the_smallest_claim_keeps_the_slice_valid(
    memory_mib: int,
) -> None:
    body = published(card(0), card(1, memory_mib))
    validate_kubernetes(body)
    assert slice_errors(body) == []


def test_a_card_too_small_for_the_smallest_claim_is_not_offered() -> None:
    body = published(card(0), card(1, MIN_MIB - 1))
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0"]


def test_a_card_that_holds_exactly_the_smallest_claim_is_offered_for_it() -> None:
    [device] = published(card(0, MIN_MIB))["spec"]["devices"]
    memory = device["capacity"]["memory"]
    assert memory["value"] == f"{MIN_MIB}Mi"
    assert memory["requestPolicy"]["validRange"]["min"] == f"{MIN_MIB}Mi"


def test_the_double_refuses_a_default_below_the_valid_range(apiserver: ApiServerDouble) -> None:
    body = published(card(0))
    body["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["default"] = "0"
    status, answer = apiserver.post(SLICES, body)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert "default is less than min" in answer["message"]


def test_the_double_refuses_a_slice_placed_twice(apiserver: ApiServerDouble) -> None:
    body = published(card(0))
    body["spec"]["allNodes"] = True
    status, answer = apiserver.post(SLICES, body)
    assert status == 422
    assert "exactly one of nodeName" in answer["message"]


def test_the_double_refuses_an_attribute_with_two_values(apiserver: ApiServerDouble) -> None:
    body = published(card(0))
    body["spec"]["devices"][0]["attributes"]["index"] = {"int": 0, "string": "0"}
    assert apiserver.post(SLICES, body)[0] == 422


def test_the_double_refuses_renaming_the_pool_of_a_stored_slice(
    apiserver: ApiServerDouble,
) -> None:
    body = published(card(0))
    assert apiserver.post(SLICES, copy.deepcopy(body))[0] == 201
    path = f"{SLICES}/{body['metadata']['name']}"
    body["spec"]["pool"]["name"] = "node-b"
    body["metadata"]["resourceVersion"] = apiserver.objects[path]["metadata"]["resourceVersion"]
    status, answer = apiserver.put(path, body)
    assert status == 422
    assert "spec.pool.name: field is immutable" in answer["message"]


def tainted(*cards: CardInfo) -> dict[str, Any]:
    """The slice with every unhealthy card's taint."""
    taints = {c.index: unhealthy_taint("NoSchedule", 1764059364) for c in cards if not c.healthy}
    return resource_slice("node-a", "qshare.io", list(cards), MIN_MIB, 1, taints)


def test_our_slice_with_an_unhealthy_cards_taint_passes_the_api_servers_checks() -> None:
    body = tainted(card(0), card(1, healthy=False))
    assert body["spec"]["devices"][1]["taints"] == [
        {"key": "qshare.io/unhealthy", "effect": "NoSchedule", "timeAdded": "2025-11-25T08:29:24Z"}
    ]
    validate_kubernetes(body)
    assert slice_errors(body) == []


@pytest.mark.parametrize(
    ("taint", "wrong"),
    [
        ({"key": "qshare.io/unhealthy", "effect": "PreferNoSchedule"}, "effect"),
        ({"key": "qshare.io/", "effect": "NoSchedule"}, "key"),
        ({"key": "Bad_Domain/unhealthy", "effect": "NoSchedule"}, "key"),
        ({"key": "qshare.io/unhealthy", "value": "not a value", "effect": "None"}, "value"),
    ],
)
def test_the_double_refuses_a_taint_the_api_server_refuses(
    apiserver: ApiServerDouble, taint: dict[str, str], wrong: str
) -> None:
    body = published(card(0))
    body["spec"]["devices"][0]["taints"] = [taint]
    status, answer = apiserver.post(SLICES, body)
    assert status == 422
    assert f"spec.devices[0].taints[0].{wrong}" in answer["message"]


def test_a_device_has_at_most_16_taints() -> None:
    body = published(card(0))
    body["spec"]["devices"][0]["taints"] = [
        {"key": f"qshare.io/t{i}", "effect": "None"} for i in range(17)
    ]
    assert slice_errors(body) == [
        "spec.devices[0].taints: Too many: 17: must have at most 16 items"
    ]


def test_a_slice_with_a_tainted_device_has_at_most_64_devices() -> None:
    many = [card(i) for i in range(65)]
    assert slice_errors(tainted(*many)) == []
    many[3] = card(3, healthy=False)
    assert slice_errors(tainted(*many)) == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]
