"""Every manifest in deploy/kubernetes is a valid object of the Kubernetes version it targets,
every kustomization names files that exist, and the RBAC stays least-privilege."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import validate_kubernetes

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(DEPLOY.rglob("kustomization.yaml"))
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_objects() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in documents(p)]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid_for_kubernetes(path: Path) -> None:
    for doc in documents(path):
        validate_kubernetes(doc)


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_kustomization_lists_existing_files_and_every_file_is_listed(path: Path) -> None:
    listed = {(path.parent / r).resolve() for r in documents(path)[0]["resources"]}
    assert all(p.is_file() for p in listed)
    others = {k.parent for k in KUSTOMIZATIONS if k != path}
    beside = {
        p.resolve()
        for p in path.parent.rglob("*.yaml")
        if p.name != "kustomization.yaml" and not others & set(p.parents)
    }
    assert beside - listed == set()


def test_the_device_classes_select_only_healthy_qshare_cards() -> None:
    classes = [d for d in all_objects() if d["kind"] == "DeviceClass"]
    assert {c["metadata"]["name"] for c in classes} == {"gpu.qshare.io", "gpu-whole.qshare.io"}
    for c in classes:
        expression = c["spec"]["selectors"][0]["cel"]["expression"]
        assert 'device.driver == "qshare.io"' in expression
        assert 'device.attributes["qshare.io"].healthy == true' in expression


def test_no_role_grants_wildcards_or_secrets() -> None:
    roles = [d for d in all_objects() if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "secrets" not in rule["resources"]


def test_the_control_plane_runs_without_a_kubernetes_token() -> None:
    names = {"qshare-allocator", "qshare-api", "qshare-preemptor"}
    deployments = [
        d for d in all_objects() if d["kind"] == "Deployment" and d["metadata"]["name"] in names
    ]
    assert len(deployments) == 3
    assert all(
        d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False for d in deployments
    )


def test_the_scheduler_configuration_calls_every_extender_verb() -> None:
    [config_map] = [d for d in all_objects() if d["metadata"]["name"] == "qshare-scheduler-config"]
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    [extender] = config["extenders"]
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    managed = {r["name"] for r in extender["managedResources"]}
    assert managed == {"qshare.io/vcore", "qshare.io/vmemory"}
