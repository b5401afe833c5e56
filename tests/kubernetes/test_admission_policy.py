"""The admission policies, their CEL evaluated as the API server would (a pure CEL evaluator,
`common-expression-language`): one narrows the node agent's RBAC to its own node, the other
keeps the pod annotations the device-plugin path trusts to the extender and the agents."""

from __future__ import annotations

from typing import Any

import cel
import pytest

from .test_manifests import all_objects

AGENT = "system:serviceaccount:qshare-system:qshare-node-agent"
NODE_KEY = "authentication.kubernetes.io/node-name"


OWN_NODE = "qshare-node-agent-own-node"
POD_NOTES = "qshare-pod-annotations"
EXTENDER = "system:serviceaccount:qshare-system:qshare-extender"
USER = "alice"


def policy(name: str = OWN_NODE) -> dict[str, Any]:
    [found] = [
        o for o in all_objects()
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]  # fmt: skip
    return found


def admit(operation: str, obj: dict[str, Any] | None, user: str = AGENT, node: str | None = "gpu-1",
          old: dict[str, Any] | None = None, name: str = OWN_NODE) -> str | None:  # fmt: skip
    """None when the policy `name` lets the request through, else its message."""
    spec = policy(name)["spec"]
    extra = {NODE_KEY: [node]} if node else {}
    context: dict[str, Any] = {
        "request": {"operation": operation, "userInfo": {"username": user, "extra": extra}},
        "object": obj,
        "oldObject": old,
    }
    if not all(cel.evaluate(c["expression"], context) for c in spec.get("matchConditions", [])):
        return None
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = cel.evaluate(
            variable["expression"], context | {"variables": variables}
        )
    context["variables"] = variables
    for check in spec["validations"]:  # a request passes only every validation
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


@pytest.mark.parametrize("name", [OWN_NODE, POD_NOTES])
def test_each_policy_is_bound_to_deny(name: str) -> None:
    [binding] = [
        o for o in all_objects()
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["spec"]["policyName"] == name
    ]  # fmt: skip
    assert binding["spec"]["validationActions"] == ["Deny"]


def pod(**notes: str) -> dict[str, Any]:
    return {"metadata": {"name": "train-0", "annotations": notes}, "spec": {"nodeName": "gpu-1"}}


def bare_pod() -> dict[str, Any]:
    return {"metadata": {"name": "train-0"}, "spec": {}}


BOUND = {"qshare.io/vgpus": '[{"local_id": 7}]', "qshare.io/claim": "c-1",
         "qshare.io/bind-time": "00000000000000000001"}  # fmt: skip


def notes(operation: str, obj: dict[str, Any], user: str = USER,
          old: dict[str, Any] | None = None) -> str | None:  # fmt: skip
    return admit(operation, obj, user=user, old=old, name=POD_NOTES)


@pytest.mark.parametrize("key", sorted(BOUND))
def test_a_user_may_not_create_a_pod_carrying_an_extenders_annotation(key: str) -> None:
    assert "by qshare's scheduler extender only" in str(notes("CREATE", pod(**{key: BOUND[key]})))


def test_a_user_creates_pods_with_other_annotations_and_none() -> None:
    assert notes("CREATE", pod(**{"qshare.io/priority": "high"})) is None
    assert notes("CREATE", bare_pod()) is None


def test_the_extender_annotates_a_pod_it_binds_and_takes_the_annotations_off_again() -> None:
    assert notes("UPDATE", pod(**BOUND), user=EXTENDER, old=bare_pod()) is None
    assert notes("UPDATE", pod(), user=EXTENDER, old=pod(**BOUND)) is None


@pytest.mark.parametrize(
    "after",
    [BOUND | {"qshare.io/vgpus": '[{"local_id": 8}]'},
     {k: v for k, v in BOUND.items() if k != "qshare.io/claim"}],
    ids=["changed", "removed"],
)  # fmt: skip
def test_a_user_may_not_change_or_remove_an_extenders_annotation(after: dict[str, str]) -> None:
    assert notes("UPDATE", pod(**after), old=pod(**BOUND)) is not None


def test_a_user_may_not_add_an_extenders_annotation_to_a_pod() -> None:
    assert notes("UPDATE", pod(**BOUND), old=pod()) is not None


def test_a_user_updates_a_bound_pods_other_annotations() -> None:
    assert notes("UPDATE", pod(**BOUND, team="a"), old=pod(**BOUND)) is None


def test_only_a_node_agent_marks_a_pod_taken() -> None:
    taken = pod(**BOUND, **{"qshare.io/allocated": "gpu-1/x1"})
    assert notes("UPDATE", taken, user=AGENT, old=pod(**BOUND)) is None
    assert "node agents only" in str(notes("UPDATE", taken, old=pod(**BOUND)))
    assert "node agents only" in str(notes("UPDATE", taken, user=EXTENDER, old=pod(**BOUND)))


def test_a_node_agent_may_not_write_an_extenders_annotation() -> None:
    assert notes("UPDATE", pod(**BOUND), user=AGENT, old=pod()) is not None
