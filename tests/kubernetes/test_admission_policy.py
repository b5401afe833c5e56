"""The admission policy narrowing the node agent's RBAC to its own node, its CEL evaluated as
the API server would (a pure CEL evaluator, `common-expression-language`) on the requests a
node agent makes."""

from __future__ import annotations

from typing import Any

import cel
import pytest

from .test_manifests import all_objects

AGENT = "system:serviceaccount:qshare-system:qshare-node-agent"
NODE_KEY = "authentication.kubernetes.io/node-name"


def policy() -> dict[str, Any]:
    [found] = [o for o in all_objects() if o["kind"] == "ValidatingAdmissionPolicy"]
    return found


def admit(operation: str, obj: dict[str, Any] | None, user: str = AGENT, node: str | None = "gpu-1",
          old: dict[str, Any] | None = None) -> str | None:  # fmt: skip
    """None when the policy lets the request through, else its message."""
    spec = policy()["spec"]
    extra = {NODE_KEY: [node]} if node else {}
    context: dict[str, Any] = {
        "request": {"operation": operation, "userInfo": {"username": user, "extra": extra}},
        "object": obj,
        "oldObject": old,
    }
    if not all(cel.evaluate(c["expression"], context) for c in spec["matchConditions"]):
        return None
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = cel.evaluate(
            variable["expression"], context | {"variables": variables}
        )
    context["variables"] = variables
    for check in spec["validations"]:
        if not cel.evaluate(check["expression"], context):
            if "messageExpression" in check:
                return str(cel.evaluate(check["messageExpression"], context))
            return str(check["message"])
    return None


def slice_of(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-qshare.io"},
        "spec": {"nodeName": node, "driver": "qshare.io"},
    }


def pod_on(node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "web-0"}, "spec": {"nodeName": node} if node else {}}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_node_agent_writes_its_own_nodes_resource_slice(operation: str) -> None:
    assert admit(operation, slice_of("gpu-1")) is None


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_node_agent_may_not_write_another_nodes_resource_slice(operation: str) -> None:
    assert "may write only its own node's" in str(admit(operation, slice_of("gpu-2")))


def test_a_node_agent_may_delete_only_its_own_nodes_resource_slice() -> None:
    assert admit("DELETE", None, old=slice_of("gpu-1")) is None
    assert admit("DELETE", None, old=slice_of("gpu-2")) is not None


def test_a_node_agent_patches_pods_on_its_node_only() -> None:
    assert admit("UPDATE", pod_on("gpu-1")) is None
    assert admit("UPDATE", pod_on("gpu-2")) is not None
    assert admit("UPDATE", pod_on(None)) is not None


def test_a_token_naming_no_node_is_refused() -> None:
    assert "names no node" in str(admit("CREATE", slice_of("gpu-1"), node=None))


def test_other_users_are_not_affected() -> None:
    assert admit("UPDATE", pod_on("gpu-2"), user="system:kube-scheduler") is None


def test_the_policy_is_bound_to_deny() -> None:
    [binding] = [o for o in all_objects() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy()["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
