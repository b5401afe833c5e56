"""The optional Prometheus-operator component (deploy/kubernetes/monitoring): its PodMonitor
and PrometheusRule pass this suite's own strict schemas, it scrapes the pods and ports qshare
really runs, and every alert and dashboard query reads series and labels the services'
code exports. Not checked: that each expression parses (that needs promtool, not installed)."""

from __future__ import annotations

import functools
import importlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import Metric
from prometheus_client.metrics import MetricWrapperBase

from qshare_api.health import router as api_health_router
from qshare_node_agent import metrics as node_metrics
from qshare_preemptor.metrics import StateCollector

from . import test_manifest_secrets
from .conftest import validate_kubernetes
from .schemas import validate_operator_object
from .test_manifests import DEPLOY, documents

MONITORING = DEPLOY / "monitoring"
SERVICE_APPS = (
    "qshare_allocator.app",
    "qshare_api.app",
    "qshare_node_agent.app",
    "qshare_preemptor.app",
)
PACKAGES = {"qshare", "qshare_allocator", "qshare_api", "qshare_node_agent", "qshare_preemptor"}
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint"})
"""The labels Prometheus and the operator give every series of a PodMonitor's targets."""
SCRAPED = {
    "qshare-allocator": "metrics",
    "qshare-node-agent": "metrics",
    "qshare-preemptor": "metrics",
    "qshare-api": "http",
    "qshare-extender": "metrics",
}
"""The workloads serving /metrics (the allocator, node agent, preemptor and extender on their
`metrics_port`, the API on its own port) and their port."""
SEVERITIES = {"critical", "warning", "info"}
Objects = list[dict[str, Any]]

rendered = test_manifest_secrets.rendered  # `kubectl kustomize deploy/kubernetes`, with secrets


def monitoring_objects() -> Objects:
    return [
        d
        for p in sorted(MONITORING.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in documents(p)
    ]


def the(kind: str) -> dict[str, Any]:
    [obj] = [o for o in monitoring_objects() if o["kind"] == kind]
    return obj


def alerts() -> list[dict[str, Any]]:
    return [r for g in the("PrometheusRule")["spec"]["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    [body] = the("ConfigMap")["data"].values()
    board: dict[str, Any] = json.loads(body)
    return board


def dashboard_targets() -> list[dict[str, Any]]:
    return [t for p in dashboard()["panels"] for t in p.get("targets", [])]


def queries() -> list[str]:
    """Every PromQL expression: the alerts', the dashboard panels' and its variables'."""
    variables = [v["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    return [a["expr"] for a in alerts()] + [t["expr"] for t in dashboard_targets()] + variables


# What the services export


def module_metrics() -> list[MetricWrapperBase]:
    """The counters, gauges and histograms the services' modules define, once each: the
    services' apps are imported, so every module they use is."""
    for app in SERVICE_APPS:
        importlib.import_module(app)
    found = {
        id(value): value
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in PACKAGES
        for value in vars(module).values()
        if isinstance(value, MetricWrapperBase)
    }
    return list(found.values())


def samples_of(metric: MetricWrapperBase) -> list[tuple[str, frozenset[str]]]:
    """(series name, label names) of what `metric` exposes. prometheus_client lists a labelled
    metric's series only once it has a child: one is made for the reading, then removed."""
    probe = ["probe"] * len(metric._labelnames)  # no public accessor
    if probe:
        metric.labels(*probe)
    try:
        return [(s.name, frozenset(s.labels)) for f in metric.collect() for s in f.samples]
    finally:
        if probe:
            metric.remove(*probe)


class _DriverStats:
    """A driver's card or vGPU stats, every figure 0."""

    def __getattr__(self, name: str) -> int:
        return 0


def node_agent_figures() -> Iterator[Metric]:
    """The families the node agent reads from its driver at each scrape, built as it builds
    them (`NodeAgent.metric_families`)."""
    for figures, labels in node_metrics.SCRAPED:
        row = (["probe"] * len(labels), _DriverStats())
        yield from node_metrics.families(figures, labels, [row])


@functools.cache
def exported() -> dict[str, frozenset[str]]:
    """Every series name the services expose, with its label names (those of its target
    added), and Prometheus's own `up`."""
    series = [s for m in module_metrics() for s in samples_of(m)]
    series += [(s.name, frozenset(s.labels)) for f in node_agent_figures() for s in f.samples]
    state = StateCollector(
        lambda: 0, lambda: {"probe": 0}
    ).collect()  # the preemptor's, read when scraped
    series += [(s.name, frozenset(s.labels)) for f in state for s in f.samples]
    found = {name: labels | TARGET_LABELS for name, labels in series}
    return found | {"up": TARGET_LABELS}


# What the queries read

_METRIC = re.compile(r"\b(qshare_\w+|up)\b")
_MATCHER = re.compile(r"\b(\w+)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*[^,]+,\s*(\w+)\s*\)")
_TEMPLATE = re.compile(r"\{\{\s*\$?(?:labels\.)?(\w+)\s*\}\}")


def metrics_in(query: str) -> set[str]:
    """The series a query reads: qshare's all begin `qshare_`, and `up`."""
    return set(_METRIC.findall(query))


def labels_in(query: str) -> set[str]:
    """The label names a query matches on, groups by or joins on."""
    grouped = {n.strip() for _, names in _GROUPING.findall(query) for n in names.split(",")}
    return set(_MATCHER.findall(query)) | set(_LABEL_VALUES.findall(query)) | grouped - {""}


def result_labels(query: str) -> set[str]:
    """The labels a query's result keeps: none for absent(), those of its `by` when it
    aggregates (each aggregation here says `by`), else those of every series it reads."""
    if "absent(" in query:
        return set()
    kept = [set(n.strip() for n in names.split(",")) for kind, names in _GROUPING.findall(query)
            if kind == "by"]  # fmt: skip
    if kept:
        return set.intersection(*kept) - {"le"}
    return set.intersection(*(set(exported()[m]) for m in metrics_in(query)))


# The objects


@pytest.mark.parametrize("kind", ["PodMonitor", "PrometheusRule"])
def test_the_operator_objects_pass_their_strict_schemas(kind: str) -> None:
    validate_operator_object(the(kind))


def test_a_field_the_operator_does_not_know_fails_its_schema() -> None:
    monitor = the("PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["targetPorts"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        validate_operator_object(monitor)


def test_the_dashboard_config_map_is_valid_for_kubernetes_and_found_by_the_grafana_sidecar() -> (
    None
):
    config_map = the("ConfigMap")
    validate_kubernetes(config_map)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    [key] = config_map["data"]
    assert key.endswith(".json")
    assert dashboard()["panels"]


def test_the_component_is_optional_not_in_the_deployments_kustomization() -> None:
    top = documents(DEPLOY / "kustomization.yaml")[0]["resources"]
    assert not any("monitoring" in r for r in top)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its kustomize) missing")
def test_the_component_builds_valid_objects_in_the_qshare_namespace() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(MONITORING)], capture_output=True, check=True
    ).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    assert {o["kind"] for o in objects} == {"PodMonitor", "PrometheusRule", "ConfigMap"}
    assert {o["metadata"]["namespace"] for o in objects} == {"qshare-system"}
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            validate_kubernetes(obj)
        else:
            validate_operator_object(obj)


# The scrape


def scraped_workloads(objects: Objects) -> dict[str, str]:
    """app.kubernetes.io/name -> port of each workload the PodMonitor scrapes: its namespace
    selected, its pods' labels matched, a container port the endpoint names, and its pod
    labels kept by the endpoint's `keep` relabelling."""
    spec = the("PodMonitor")["spec"]
    scraped = {}
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        if obj["metadata"]["namespace"] not in spec["namespaceSelector"]["matchNames"]:
            continue
        pod = obj["spec"]["template"]
        labels = pod["metadata"]["labels"]
        if not spec["selector"]["matchLabels"].items() <= labels.items():
            continue
        ports = {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in spec["podMetricsEndpoints"]:
            if endpoint["port"] in ports and _kept(endpoint, labels):
                scraped[labels["app.kubernetes.io/name"]] = endpoint["port"]
    return scraped


def _kept(endpoint: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    meta = {
        "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
        for k, v in pod_labels.items()
    }
    for relabel in endpoint.get("relabelings", []):
        assert relabel["action"] == "keep", "only `keep` relabellings are understood here"
        value = ";".join(meta.get(s, "") for s in relabel["sourceLabels"])
        if not re.fullmatch(relabel["regex"], value):
            return False
    return True


def test_the_pod_monitor_scrapes_every_service_with_metrics_on_its_port(
    rendered: Objects,
) -> None:
    """On the pods as kustomize renders them (part-of: qshare is the kustomization's label)."""
    assert scraped_workloads(rendered) == SCRAPED


def test_the_pod_monitor_names_each_job_after_a_label_every_scraped_pod_carries(
    rendered: Objects,
) -> None:
    job_label = the("PodMonitor")["spec"]["jobLabel"]
    pods = [o["spec"]["template"] for o in rendered if "template" in o.get("spec", {})]
    names = {p["metadata"]["labels"].get(job_label) for p in pods}
    assert set(SCRAPED) <= names


def test_the_api_serves_metrics_on_the_path_the_pod_monitor_scrapes() -> None:
    paths = {getattr(r, "path", None) for r in api_health_router.routes}
    assert {e["path"] for e in the("PodMonitor")["spec"]["podMetricsEndpoints"]} <= paths


def test_every_node_agent_series_names_its_node_so_nothing_relabels_one_in() -> None:
    node_series = [n for n in exported() if n.startswith(("qshare_node_", "qshare_vgpu_",
                                                          "qshare_card_"))]  # fmt: skip
    assert node_series
    assert all("node" in exported()[n] for n in node_series)
    endpoints = the("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert all(r.get("targetLabel") != "node" for e in endpoints for r in e.get("relabelings", []))


# The queries


@pytest.mark.parametrize("query", queries())
def test_every_query_reads_series_the_services_export(query: str) -> None:
    assert metrics_in(query), "no qshare series read"
    assert metrics_in(query) <= set(exported()), metrics_in(query) - set(exported())


@pytest.mark.parametrize("query", queries())
def test_every_label_a_query_uses_is_on_every_series_it_reads(query: str) -> None:
    for metric in metrics_in(query):
        assert labels_in(query) <= exported()[metric], (metric, labels_in(query))


def test_every_job_a_query_names_is_a_scraped_workload() -> None:
    jobs = re.compile(r"\bjob\s*=~?\s*\"([^\"]*)\"")
    named = {j for q in queries() for m in jobs.findall(q) for j in m.split("|")}
    assert named
    assert named <= set(SCRAPED)


def test_every_legend_names_a_label_its_query_keeps() -> None:
    for target in dashboard_targets():
        used = set(_TEMPLATE.findall(target["legendFormat"]))
        assert used <= result_labels(target["expr"]), (target["expr"], used)


# The alerts


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: str(a["alert"]))
def test_every_alert_has_a_severity_a_wait_and_says_what_and_why(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    assert alert["for"]
    assert alert["annotations"]["summary"] and alert["annotations"]["description"]


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: str(a["alert"]))
def test_every_label_an_alerts_text_names_is_one_its_expression_keeps(
    alert: dict[str, Any],
) -> None:
    used = {n for text in alert["annotations"].values() for n in _TEMPLATE.findall(text)}
    assert used <= result_labels(alert["expr"]), used


_UP_JOBS = re.compile(r"\bup\{job=~?\"([^\"]*)\"\}")


def _watched_jobs(pattern: str) -> set[str]:
    """The scraped jobs whose pods alerts read `up` of in expressions matching `pattern`."""
    found = set()
    for alert in alerts():
        if re.search(pattern, alert["expr"]):
            for jobs in _UP_JOBS.findall(alert["expr"]):
                found |= {j for j in SCRAPED if re.fullmatch(jobs, j)}
    return found


def test_every_scraped_workload_pages_when_none_of_its_pods_answers() -> None:
    """A workload with no pod up (`absent(up{job=...} == 1)`) stops what qshare does: the
    extender's verbs, which the scheduler may not ignore, included (no qshare pod is
    scheduled without it); node agents, one per node, are watched per pod instead."""
    assert _watched_jobs(r"^absent\(up\{") == set(SCRAPED) - {"qshare-node-agent"}


def test_every_scraped_pod_of_a_workload_with_several_that_stops_answering_is_an_alert() -> None:
    """Per pod (`up == 0`): one replica of two down, or one node's agent; the preemptor's one
    replica is its absent-alert's."""
    assert _watched_jobs(r"== 0") == set(SCRAPED) - {"qshare-preemptor"}


def test_the_dashboards_targets_panel_shows_every_scraped_workload() -> None:
    [panel] = [p for p in dashboard()["panels"] if p["title"] == "Targets up"]
    [jobs] = [j for t in panel["targets"] for j in _UP_JOBS.findall(t["expr"])]
    assert {j for j in SCRAPED if re.fullmatch(jobs, j)} == set(SCRAPED)
