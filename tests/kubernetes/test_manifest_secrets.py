"""`kubectl apply -k deploy/kubernetes` gives a secured cluster: the manifests, rendered by
kustomize with the secrets `python -m qshare.kube_secrets` generates, give every service and
every node agent the NATS identity that `qshare.natsauth` expects of it, NATS enforces them,
and the API bootstraps its first admin from the generated token."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.aio.client import Client
from pydantic import SecretStr

from qshare import bus, kube_secrets
from qshare.bus import BusOptions
from qshare.contracts import subjects
from qshare.natsauth import ServiceRole, inbox_prefix, permissions, user_name
from qshare.testing.servers import EmbeddedNats
from qshare_allocator.settings import AllocatorSettings
from qshare_api.settings import ApiSettings
from qshare_node_agent.settings import NodeAgentSettings
from qshare_preemptor.settings import PreemptorSettings

from .conftest import validate_kubernetes
from .test_manifests import DEPLOY, KUSTOMIZATIONS, SECRETS, documents

NODES = ["gpu-node-7", "gpu-node-8.zone-a"]
KUBECTL = shutil.which("kubectl")
FILE_SETUP = {"nats-identity"}
"""The init containers run here: they only copy files between the pod's volumes (the others
need the image's files or the database)."""
Objects = list[dict[str, Any]]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Objects:
    """`kubectl kustomize` of a copy of deploy/kubernetes with freshly generated secrets."""
    root = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns(SECRETS.name))
    kube_secrets.write_kustomization(root / SECRETS.name, NODES)
    if KUBECTL is None:
        pytest.skip("kubectl (its kustomize) is not installed")
    out = subprocess.run([KUBECTL, "kustomize", str(root)], capture_output=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def secret_data(objects: Objects, name: str) -> dict[str, str]:
    """The decoded data of the generated Secret first named `name` (before its hash)."""
    [secret] = [
        o
        for o in objects
        if o["kind"] == "Secret"
        and re.fullmatch(f"{name}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def server_config(objects: Objects) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(secret_data(objects, "qshare-nats-server")["nats.conf"])
    return config


def server_passwords(objects: Objects) -> dict[str, str]:
    return {u["user"]: u["password"] for u in server_config(objects)["authorization"]["users"]}


@dataclass
class Pod:
    """One pod of a rendered workload, as the kubelet would set it up on node `node`: its
    volumes are directories under `root` (a Secret's keys as files), each container sees
    them at its mount paths under `root/<container>`, and its init containers have run."""

    objects: Objects
    spec: dict[str, Any]
    root: Path
    node: str

    def __post_init__(self) -> None:
        for volume in self.spec.get("volumes", []):
            directory = self.root / "volumes" / volume["name"]
            directory.mkdir(parents=True)
            if "secret" in volume:
                for key, value in self._secret(volume["secret"]["secretName"]).items():
                    (directory / key).write_text(value)
        for container in self.spec.get("initContainers", []):
            if container["name"] in FILE_SETUP:
                self.run(container)

    def _secret(self, name: str) -> dict[str, str]:
        [secret] = [
            o for o in self.objects if o["kind"] == "Secret" and o["metadata"]["name"] == name
        ]
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}

    def container(self, name: str) -> dict[str, Any]:
        found = self.spec.get("initContainers", []) + self.spec["containers"]
        [container] = [c for c in found if c["name"] == name]
        return container

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        """The container's own variables (ConfigMaps aside), paths moved under its root."""
        env: dict[str, str] = {}
        for var in container.get("env", []):
            ref = var.get("valueFrom", {})
            if "fieldRef" in ref:
                assert ref["fieldRef"]["fieldPath"] == "spec.nodeName"
                env[var["name"]] = self.node
            elif "secretKeyRef" in ref:
                env[var["name"]] = "postgresql+asyncpg://u:p@db/qshare"
            else:
                env[var["name"]] = self.path(container, str(var["value"]))
        return env

    def path(self, container: dict[str, Any], value: str) -> str:
        """`value`, if a path inside the container, as the same file here."""
        if not value.startswith("/"):
            return value
        seen = self.root / container["name"]
        for mount in container.get("volumeMounts", []):
            at = seen / mount["mountPath"].lstrip("/")
            if not at.exists():
                at.parent.mkdir(parents=True, exist_ok=True)
                at.symlink_to(self.root / "volumes" / mount["name"])
        return str(seen / value.lstrip("/"))

    def run(self, container: dict[str, Any]) -> None:
        """Run a command container here, with the kubelet's `$(VAR)` expansion."""
        env = self.env(container)
        words = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], w) for w in container["command"]]
        subprocess.run([self.path(container, w) for w in words], check=True, capture_output=True)


def pod_of(objects: Objects, workload: str, root: Path, node: str = NODES[0]) -> Pod:
    [obj] = [
        o
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
        and o["metadata"]["name"] == workload
    ]
    return Pod(objects, obj["spec"]["template"]["spec"], root, node)


def bus_options(
    monkeypatch: pytest.MonkeyPatch, pod: Pod, container: str
) -> tuple[BusOptions, str]:
    """How `container` of `pod` connects to NATS (its settings, from the manifests alone),
    and the identity its role and node must have."""
    spec = pod.container(container)
    for name, value in pod.env(spec).items():
        monkeypatch.setenv(name, value)
    module = spec["command"][-1]
    if module == "qshare_node_agent":
        agent = NodeAgentSettings()
        return agent.bus_as("t", ServiceRole.NODE, agent.name), user_name(
            ServiceRole.NODE, pod.node
        )
    if module == "qshare_preemptor":
        return PreemptorSettings().bus_as("t", ServiceRole.PREEMPTOR), "preemptor"
    settings = {"qshare_api": ApiSettings, "qshare_allocator": AllocatorSettings}[module]()
    return settings.bus("t"), {"qshare_api": "api", "qshare_allocator": "allocator"}[module]


def test_generating_again_keeps_every_password_and_the_token_and_adds_nodes(
    tmp_path: Path,
) -> None:
    kube_secrets.write_kustomization(tmp_path, ["a"])
    before = {p.name: p.read_text() for p in tmp_path.iterdir() if p.suffix != ".conf"}
    kube_secrets.write_kustomization(tmp_path, ["b"])
    after = {p.name: p.read_text() for p in tmp_path.iterdir() if p.suffix != ".conf"}
    assert {k: after[k] for k in before if k != "kustomization.yaml"} == {
        k: v for k, v in before.items() if k != "kustomization.yaml"
    }
    generated = yaml.safe_load(after["kustomization.yaml"])["secretGenerator"]
    [nodes] = [g for g in generated if g["name"] == kube_secrets.NODES_SECRET]
    assert nodes["files"] == ["node-a.password", "node-b.password"]


def test_the_rendered_deployment_is_valid_for_kubernetes(rendered: Objects) -> None:
    kinds = {o["kind"] for o in rendered}
    assert {"Secret", "StatefulSet", "DaemonSet"} <= kinds
    for obj in rendered:
        validate_kubernetes(obj)


def test_nats_has_one_identity_per_service_and_node_with_its_roles_permissions(
    rendered: Objects,
) -> None:
    users = {u["user"]: u["permissions"] for u in server_config(rendered)["authorization"]["users"]}
    nodes = {user_name(ServiceRole.NODE, n): (ServiceRole.NODE, n) for n in NODES}
    roles = {r.value: (r, None) for r in ServiceRole if r is not ServiceRole.NODE} | nodes
    assert set(users) == set(roles)
    for user, (role, node) in roles.items():
        assert users[user] == permissions(role, node)


def test_the_nats_server_loads_its_config_from_the_generated_secret(rendered: Objects) -> None:
    [nats_set] = [o for o in rendered if o["kind"] == "StatefulSet"]
    spec = nats_set["spec"]["template"]["spec"]
    [container] = spec["containers"]
    config = Path(container["args"][container["args"].index("-c") + 1])
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config.parent]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"].startswith("qshare-nats-server-")
    assert config.name in secret_data(rendered, "qshare-nats-server")
    assert "-js" in container["args"]


@pytest.mark.parametrize(
    ("workload", "container"),
    [
        ("qshare-allocator", "allocator"),
        ("qshare-api", "api"),
        ("qshare-extender", "extender"),
        ("qshare-preemptor", "preemptor"),
        ("qshare-node-agent", "agent"),
    ],
)
def test_every_service_connects_as_its_own_nats_identity(
    rendered: Objects,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    workload: str,
    container: str,
) -> None:
    options, expected = bus_options(monkeypatch, pod_of(rendered, workload, short_dir), container)
    assert options.user == expected
    assert options.password is not None
    assert options.password.get_secret_value() == server_passwords(rendered)[expected]


@pytest.mark.parametrize("node", NODES)
def test_a_node_agent_sees_only_its_own_nodes_password(
    rendered: Objects, short_dir: Path, node: str
) -> None:
    pod = pod_of(rendered, "qshare-node-agent", short_dir, node)
    agent = pod.container("agent")
    visible = {
        p.name
        for m in agent["volumeMounts"]
        for p in Path(pod.path(agent, m["mountPath"])).glob("*.password")
    }
    assert visible == {f"{user_name(ServiceRole.NODE, node)}.password"}


def test_a_node_missing_from_the_secret_stops_at_the_init_container(
    rendered: Objects, short_dir: Path
) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        pod_of(rendered, "qshare-node-agent", short_dir, "gpu-node-new")
    assert b"node-gpu-node-new.password" in failed.value.stderr


def test_the_api_bootstraps_its_first_admin_from_the_generated_token(
    rendered: Objects, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = pod_of(rendered, "qshare-api", short_dir)
    for name, value in pod.env(pod.container("api")).items():
        monkeypatch.setenv(name, value)
    token = secret_data(rendered, "qshare-admin-token")["admin.token"].strip()
    assert token.startswith("qs_")
    assert ApiSettings().bootstrap_secret() == token


def test_no_other_pod_mounts_the_admin_token_or_another_services_password(
    rendered: Objects,
) -> None:
    wanted = {
        "nats": {"qshare-nats-server"},
        "qshare-allocator": {"qshare-nats-allocator"},
        "qshare-api": {"qshare-nats-api", "qshare-admin-token"},
        "qshare-extender": {"qshare-nats-api"},
        "qshare-preemptor": {"qshare-nats-preemptor"},
        "qshare-node-agent": {"qshare-nats-nodes"},
    }
    for obj in rendered:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            volumes = obj["spec"]["template"]["spec"].get("volumes", [])
            secrets = {_unhashed(v["secret"]["secretName"]) for v in volumes if "secret" in v}
            assert secrets == wanted[obj["metadata"]["name"]]


def _unhashed(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def test_adding_a_node_renames_the_nats_config_but_not_the_nodes_secret(tmp_path: Path) -> None:
    """NATS restarts with the new identity; the running node agents are not rolled."""
    root = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns(SECRETS.name))
    kube_secrets.write_kustomization(root / SECRETS.name, NODES)
    before = _secret_names(root)
    kube_secrets.write_kustomization(root / SECRETS.name, ["gpu-node-9"])
    after = _secret_names(root)
    assert before["qshare-nats-server"] != after["qshare-nats-server"]
    assert before["qshare-nats-nodes"] == after["qshare-nats-nodes"] == "qshare-nats-nodes"
    assert before["qshare-nats-api"] == after["qshare-nats-api"]


def _secret_names(root: Path) -> dict[str, str]:
    if KUBECTL is None:
        pytest.skip("kubectl (its kustomize) is not installed")
    out = subprocess.run([KUBECTL, "kustomize", str(root)], capture_output=True, check=True)
    objects = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Secret"]
    return {_unhashed(o["metadata"]["name"]): o["metadata"]["name"] for o in objects}


@contextlib.asynccontextmanager
async def connected(url: str, options: BusOptions) -> AsyncIterator[tuple[Client, list[str]]]:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    assert options.user is not None and options.password is not None
    client = await nats.connect(
        url, user=options.user, password=options.password.get_secret_value(),
        inbox_prefix=inbox_prefix(options.user), error_cb=on_error, max_reconnect_attempts=0,
    )  # fmt: skip
    try:
        yield client, errors
    finally:
        await client.close()


async def delivered(url: str, operator: BusOptions, sender: Client, subject: str) -> bool:
    """Whether what `sender` publishes on `subject` reaches a subscriber there."""
    async with connected(url, operator) as (watcher, _):
        sub = await watcher.subscribe(subject)
        await bus.settled(watcher)
        await sender.publish(subject, b"{}")
        await bus.settled(sender)
        with contextlib.suppress(nats.errors.TimeoutError):
            await sub.next_msg(timeout=0.3)
            return True
        return False


async def test_nats_with_the_rendered_config_lets_a_node_agent_publish_only_its_own_subjects(
    rendered: Objects, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real nats-server run with the Secret's nats.conf, the agent connecting with the
    identity the DaemonSet gives it on node gpu-node-7."""
    pod = pod_of(rendered, "qshare-node-agent", short_dir)
    agent, _ = bus_options(monkeypatch, pod, "agent")
    operator = BusOptions("", "op", "operator", SecretStr(server_passwords(rendered)["operator"]))
    config = secret_data(rendered, "qshare-nats-server")["nats.conf"]
    async with EmbeddedNats(config) as server, connected(server.url, agent) as (client, errors):
        assert await delivered(server.url, operator, client, subjects.heartbeat(NODES[0]))
        assert not await delivered(server.url, operator, client, subjects.heartbeat(NODES[1]))
        assert any("permissions violation" in e.lower() for e in errors)


def test_every_pod_carries_the_part_of_label_a_pod_monitor_selects(rendered: Objects) -> None:
    """Prometheus (a PodMonitor on `app.kubernetes.io/part-of: qshare`) finds every pod."""
    workloads = ("Deployment", "DaemonSet", "StatefulSet")
    templates = [o["spec"]["template"] for o in rendered if o["kind"] in workloads]
    assert templates
    for template in templates:
        assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "qshare"


def _namespaces(objects: Objects) -> dict[tuple[str, str], str | None]:
    return {(o["kind"], o["metadata"]["name"]): o["metadata"].get("namespace") for o in objects}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_object_lands_in_the_namespace_its_manifest_names(
    kustomization: Path, rendered: Objects
) -> None:
    """A kustomization's `namespace:` moves every namespaced object into it: the scheduler's
    configuration, written for `kube-system` (where a kube-scheduler can mount it), was
    rendered into `qshare-system` by the top kustomization."""
    if kustomization.parent == DEPLOY:
        objects = rendered
    else:
        out = subprocess.run(
            [str(KUBECTL), "kustomize", str(kustomization.parent)], capture_output=True, check=True
        )
        objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    listed = [kustomization.parent / r for r in documents(kustomization)[0]["resources"]]
    declared = {
        key: ns
        for path in listed
        if path.is_file()
        for key, ns in _namespaces(documents(path)).items()
        if ns is not None
    }
    got = _namespaces(objects)
    assert {key: got.get(key) for key in declared} == declared
