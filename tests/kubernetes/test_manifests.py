"""Every manifest in deploy/kubernetes is a valid object of the Kubernetes version it targets,
every kustomization names files that exist, and the RBAC stays least-privilege."""

from __future__ import annotations

import importlib
import json
import os
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


NODE_NAME = "gpu-node-7"
SERVICES = {  # container command module -> its settings class
    "qshare_node_agent": "qshare_node_agent.settings:NodeAgentSettings",
    "qshare_api": "qshare_api.settings:ApiSettings",
    "qshare_allocator": "qshare_allocator.settings:AllocatorSettings",
    "qshare_preemptor": "qshare_preemptor.settings:PreemptorSettings",
}


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives `container`: its ConfigMaps (from these manifests),
    then its own variables; a pod field reads this test's node, a Secret a placeholder."""
    maps = {d["metadata"]["name"]: d["data"] for d in all_objects() if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= maps[source["configMapRef"]["name"]]
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "spec.nodeName"
            env[var["name"]] = NODE_NAME
        elif "secretKeyRef" in ref:
            env[var["name"]] = "postgresql+asyncpg://u:p@db/qshare"
        else:
            env[var["name"]] = str(var["value"])
    return env


def service_settings(
    monkeypatch: pytest.MonkeyPatch, workload: str, container: str
) -> tuple[Any, dict[str, str]]:
    """The settings `container` of `workload` builds from the environment its manifest gives."""
    [obj] = [
        d
        for d in all_objects()
        if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == workload
    ]
    [spec] = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == container]
    env = container_env(spec)
    for name in [n for n in os.environ if n.startswith("QSHARE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    module, cls = SERVICES[spec["command"][-1]].split(":")
    return getattr(importlib.import_module(module), cls)(), env


@pytest.mark.parametrize(
    ("workload", "container"),
    [
        ("qshare-node-agent", "agent"),
        ("qshare-api", "api"),
        ("qshare-extender", "extender"),
        ("qshare-allocator", "allocator"),
        ("qshare-preemptor", "preemptor"),
    ],
)
def test_every_service_reaches_nats_at_the_in_cluster_service(
    monkeypatch: pytest.MonkeyPatch, workload: str, container: str
) -> None:
    settings, _ = service_settings(monkeypatch, workload, container)
    assert settings.nats_url == "nats://nats.qshare-system.svc:4222"


@pytest.mark.parametrize(
    ("workload", "container"),
    [
        ("qshare-api", "api"),
        ("qshare-extender", "extender"),
        ("qshare-allocator", "allocator"),
        ("qshare-preemptor", "preemptor"),
    ],
)
def test_every_service_with_postgres_takes_its_database_url_from_the_secret(
    monkeypatch: pytest.MonkeyPatch, workload: str, container: str
) -> None:
    """Not the settings' default (localhost), which no pod has."""
    settings, _ = service_settings(monkeypatch, workload, container)
    assert settings.database_url == "postgresql+asyncpg://u:p@db/qshare"


def test_the_node_agent_serves_the_kubelet_plugins_as_its_kubernetes_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DaemonSet turns the plugins on and names the agent after the node it runs on: the
    extender asks the allocator about Kubernetes node names, and the pod's host name (the
    default) is not one."""
    settings, env = service_settings(monkeypatch, "qshare-node-agent", "agent")
    assert settings.kubernetes is True
    assert settings.name == NODE_NAME
    assert env["QSHARE_K8S_NODE_NAME"] == NODE_NAME


def test_the_extender_takes_the_schedulers_request_for_five_thousand_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With nodeCacheCapable the scheduler sends every candidate's name in one request; the
    API's default body limit (64 KiB) would refuse every pod past ~2,000 nodes of 30-odd
    characters (a GKE-style name), and the extender is not ignorable."""
    settings, _ = service_settings(monkeypatch, "qshare-extender", "extender")
    names = [f"gke-prod-a100-pool-{n:08x}-{n % 9999:04d}" for n in range(5000)]
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u" * 36}, "spec": {}}
    body = json.dumps({"Pod": pod | {"pad": "x" * 8192}, "NodeNames": names})
    assert len(body) <= settings.max_body_bytes
