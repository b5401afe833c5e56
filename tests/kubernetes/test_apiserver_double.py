"""The API server double's preconditions answer as the real server's do: a stale
resourceVersion in a merge patch is 409 Conflict, another instance's uid is 422 Invalid (the
uid is immutable), and a Binding for another instance, or for a pod already assigned, is 409
Conflict."""

from __future__ import annotations

import uuid
from typing import Any

from .doubles import ApiServerDouble

POD = "/api/v1/namespaces/ns/pods/web-0"


def stored(apiserver: ApiServerDouble) -> dict[str, Any]:
    apiserver.put_object(POD, {"kind": "Pod", "metadata": {"name": "web-0", "uid": "u1"}})
    return apiserver.objects[POD]["metadata"]


def binding(uid: str) -> dict[str, Any]:
    return {"kind": "Binding", "metadata": {"name": "web-0", "uid": uid},
            "target": {"kind": "Node", "name": "node-a"}}  # fmt: skip


def test_a_patch_naming_the_instance_and_version_it_read_is_applied(
    apiserver: ApiServerDouble,
) -> None:
    meta = stored(apiserver)
    patch = {"metadata": {"uid": "u1", "resourceVersion": meta["resourceVersion"],
                          "annotations": {"a": "b"}}}  # fmt: skip
    status, body = apiserver.patch(POD, patch)
    assert status == 200 and body["metadata"]["annotations"] == {"a": "b"}


def test_a_patch_with_a_stale_resource_version_is_a_conflict(apiserver: ApiServerDouble) -> None:
    stored(apiserver)
    status, body = apiserver.patch(POD, {"metadata": {"resourceVersion": "0", "uid": "other"}})
    assert (status, body["reason"], body["code"]) == (409, "Conflict", 409)
    assert body["message"].startswith('Operation cannot be fulfilled on pods "web-0": the object')


def test_a_patch_naming_another_instance_is_invalid_and_changes_nothing(
    apiserver: ApiServerDouble,
) -> None:
    before = dict(stored(apiserver))
    status, body = apiserver.patch(POD, {"metadata": {"uid": "u0", "annotations": {"a": "b"}}})
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'Pod "web-0" is invalid: metadata.uid: Invalid value: "u0": field is immutable'
    )
    assert apiserver.objects[POD]["metadata"] == before


def test_a_binding_for_another_instance_is_a_conflict(apiserver: ApiServerDouble) -> None:
    stored(apiserver)
    status, body = apiserver.post(f"{POD}/binding", binding(str(uuid.uuid4())))
    assert (status, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition" in body["message"]
    assert "nodeName" not in apiserver.objects[POD].get("spec", {})


def test_binding_a_pod_already_assigned_is_a_conflict(apiserver: ApiServerDouble) -> None:
    stored(apiserver)
    assert apiserver.post(f"{POD}/binding", binding("u1"))[0] == 201
    status, body = apiserver.post(f"{POD}/binding", binding("u1"))
    assert status == 409
    assert 'pod web-0 is already assigned to node "node-a"' in body["message"]
