"""Fixtures for the Kubernetes tests: a real driver segment with simulated cards and the
node agent's `LocalVgpus` on it, the kubelet and API server test doubles, the DRA plugin
serving on unix sockets, and validators for Kubernetes objects and CDI specs."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from qshare_driver.node import Node
from qshare_node_agent.discovery import Card
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from tests.controlplane import conftest as controlplane

from .doubles import ApiServerDouble, KubeletDouble

# The control plane's fixtures, for the extender tests: real Postgres, NATS and allocators.
database_url = controlplane.database_url
nats_auth = controlplane.nats_auth
nats_server = controlplane.nats_server
bus_url = controlplane.bus_url
replicas = controlplane.replicas
engine = controlplane.engine
nc = controlplane.nc

K8S_VERSION = "1.36.0"
NODE = "node-a"
DRIVER = "qshare.io"
CARD_MIB = 16384
CARDS = [
    Card(0, "GPU-0a1b2c3d-0000-4000-8000-00000000c0de", "Simulated H100", CARD_MIB, 0),
    Card(1, "GPU-0a1b2c3d-0000-4000-8000-00000000c0d1", "Simulated H100", CARD_MIB, 1),
]
CDI_SCHEMA = Path(__file__).parents[2] / (
    "services/node-agent/qshare_node_agent/kubernetes/cdi-spec.schema.json"
)
_names = itertools.count()


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    """Until `predicate()` holds; fails the test after `timeout` seconds (the bound only stops
    a broken test, it asserts no timing: a loaded 2-core CI machine may need many seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def validate_kubernetes(obj: dict[str, Any]) -> None:
    """Raise unless `obj` is valid for the targeted Kubernetes version (strict: no unknown
    fields)."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def validate_cdi(spec: dict[str, Any]) -> None:
    jsonschema.validate(spec, json.loads(CDI_SCHEMA.read_text()))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="qk8s-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_node(directory: Path, name: str | None = None, replace: bool = False) -> Node:
    node = Node.create(name or f"k8s-{os.getpid()}-{next(_names)}", directory, replace=replace)
    for card in CARDS:
        node.add_card(card.index, card.uuid, card.memory_mib << 20)
    return node


@pytest.fixture
def shm(short_dir: Path) -> Path:
    """The directory of the test's driver segments."""
    path = short_dir / "shm"
    path.mkdir()
    return path


@pytest.fixture
def node(shm: Path) -> Iterator[Node]:
    with make_node(shm) as n:
        yield n


@pytest.fixture
def backend(node: Node) -> LocalVgpus:
    return LocalVgpus(node, CARDS, min_vgpu_mib=1024)


@pytest.fixture
def apiserver() -> Iterator[ApiServerDouble]:
    server = ApiServerDouble()
    yield server
    server.close()


@pytest.fixture
def settings(short_dir: Path, apiserver: ApiServerDouble) -> KubernetesSettings:
    return KubernetesSettings(
        node_name=NODE,
        registry_dir=short_dir / "registry",
        plugin_dir=short_dir / "plugin",
        device_plugin_dir=short_dir / "dp",
        cdi_dir=short_dir / "cdi",
        api_server=apiserver.url,
        token_file=None,
        ca_file=None,
        socket_check_s=0.05,
        vmemory_unit_mib=256,
    )


@pytest.fixture
def plugin_env(
    settings: KubernetesSettings, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> KubernetesSettings:
    """`settings` as a node agent reads them (QSHARE_K8S_*), with no token or CA file."""
    values = settings.model_dump(mode="json", exclude_none=True)
    values |= {"token_file": str(short_dir / "none"), "ca_file": str(short_dir / "none")}
    for key, value in values.items():
        monkeypatch.setenv(f"QSHARE_K8S_{key.upper()}", str(value))
    return settings


@pytest.fixture
def kube_api(settings: KubernetesSettings) -> Iterator[KubeApi]:
    api = KubeApi(settings.api_server, None, None, timeout_s=5)
    yield api
    api.close()


@pytest.fixture
def kubelet() -> Iterator[KubeletDouble]:
    k = KubeletDouble()
    yield k
    k.close()


@pytest.fixture
def dra(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: KubeApi
) -> Iterator[DraPlugin]:
    plugin = DraPlugin(settings, backend, kube_api)
    plugin.start()
    yield plugin
    plugin.stop()


def resource_claim(
    name: str,
    consumed: dict[str, str] | None = None,
    device: str = "gpu-0",
    node: str = NODE,
    parameters: Any = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated to `device` on `node`, reserved
    for a pod."""
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": node,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": consumed or {"memory": "4Gi", "cores": "30"},
    }
    devices: dict[str, Any] = {"results": [result]}
    if parameters is not None:
        devices["config"] = [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": parameters},
            }
        ]
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.qshare.io",
                            "capacity": {"requests": {"memory": "4Gi", "cores": "30"}},
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {"devices": devices, "nodeSelector": selector},
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
        },
    }


def store_claim(apiserver: ApiServerDouble, claim: dict[str, Any]) -> tuple[str, str, str]:
    meta = claim["metadata"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
    apiserver.put_object(path, claim)
    return meta["namespace"], meta["name"], meta["uid"]
