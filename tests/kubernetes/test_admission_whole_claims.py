"""The admission policy on whole-card claims, its CEL evaluated as the API server would: a
request of device class gpu-whole.qshare.io that does not ask `cores: "100"` is refused when
the ResourceClaim or ResourceClaimTemplate is written (before, the node agent refused it at
prepare, after the pod was scheduled); every other request passes."""

from __future__ import annotations

from typing import Any

import pytest

from .test_admission_policy import USER, admit, policy
from .test_manifests import all_objects

WHOLE = "qshare-whole-card-claims"
CLASS = "gpu-whole.qshare.io"


def ask(cores: str | None, device_class: str = CLASS) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if cores is not None:
        exactly["capacity"] = {"requests": {"cores": cores}}
    return exactly


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "ResourceClaim", "spec": {"devices": {"requests": list(requests)}}}


def template(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "ResourceClaimTemplate", "spec": claim(*requests)}


def verdict(obj: dict[str, Any], operation: str = "CREATE") -> str | None:
    return admit(operation, obj, user=USER, node=None, name=WHOLE)


@pytest.mark.parametrize("shape", [claim, template])
def test_a_whole_card_request_without_cores_is_refused_naming_it(shape: Any) -> None:
    refused = verdict(shape({"name": "gpu", "exactly": ask(None)}))
    assert refused is not None and "request gpu of device class" in refused


@pytest.mark.parametrize("cores", ["10", "99"])
def test_a_whole_card_request_for_part_of_the_cores_is_refused(cores: str) -> None:
    assert verdict(claim({"name": "gpu", "exactly": ask(cores)})) is not None


def test_a_whole_card_subrequest_without_cores_is_refused_naming_its_request() -> None:
    options = [{"name": "slice", **ask("20", "gpu.qshare.io")}, {"name": "whole", **ask(None)}]
    first = {"name": "gpu", "firstAvailable": options}
    refused = verdict(claim(first))
    assert refused is not None and refused.startswith("request gpu ")


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_whole_card_request_for_every_core_passes(operation: str) -> None:
    assert verdict(template({"name": "gpu", "exactly": ask("100")}), operation) is None


def test_other_classes_requests_pass_untouched() -> None:
    """Guard: a slice's request, another driver's, and a claim of no device requests."""
    slice_ask = {"name": "a", "exactly": ask(None, "gpu.qshare.io")}
    other_driver = {"name": "b", "exactly": ask(None, "gpu.nvidia.com")}
    assert verdict(claim(slice_ask, other_driver)) is None
    assert verdict({"kind": "ResourceClaim", "spec": {}}) is None


def test_the_policy_is_bound_to_deny_and_installed() -> None:
    bindings = [o for o in all_objects() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    bound = [b for b in bindings if b["spec"]["policyName"] == WHOLE]
    assert [b["spec"]["validationActions"] for b in bound] == [["Deny"]]
    assert policy(WHOLE)["spec"]["failurePolicy"] == "Fail"
