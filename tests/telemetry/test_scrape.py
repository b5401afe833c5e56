"""What Prometheus really reads: the allocator, the API, the preemptor and a simulated node
agent run as their own processes, as deployed, and every series the monitoring component's
alerts and dashboard read (deploy/kubernetes/monitoring) must be one of the families their
/metrics endpoints serve. tests/kubernetes/test_monitoring.py checks the names and labels
against the metric objects in the code; this checks that each is wired to an endpoint."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from qshare.testing.servers import free_port

from .test_traces import ADMIN_TOKEN, _service, _until_ready, servers  # noqa: F401

MONITORING = Path(__file__).parents[2] / "deploy" / "kubernetes" / "monitoring"
SERIES = re.compile(r"\b(qshare_\w+|up)\b")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum"), "gauge": ("",), "unknown": ("",)}  # fmt: skip
"""The series a family of each type is read as."""


@pytest.fixture(scope="module")
def metrics_urls(
    servers: tuple[str, str],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[str]]:
    database_url, nats_url = servers
    logs = tmp_path_factory.mktemp("scraped")
    ports = [free_port() for _ in range(4)]
    allocator_env = {"QSHARE_ALLOCATOR_DATABASE_URL": database_url,
                     "QSHARE_ALLOCATOR_NATS_URL": nats_url}  # fmt: skip
    started = [
        _service("qshare_allocator", allocator_env | {
            "QSHARE_ALLOCATOR_MIGRATE_ON_START": "true",
            "QSHARE_ALLOCATOR_METRICS_PORT": str(ports[0])}, logs / "allocator.log"),
        _service("qshare_preemptor", {
            "QSHARE_PREEMPTOR_DATABASE_URL": database_url, "QSHARE_PREEMPTOR_NATS_URL": nats_url,
            "QSHARE_PREEMPTOR_METRICS_PORT": str(ports[1])}, logs / "preemptor.log"),
        _service("qshare_node_agent", {
            "QSHARE_NODE_NAME": "scraped-1", "QSHARE_NODE_NATS_URL": nats_url,
            "QSHARE_NODE_SIMULATE": "1:16Gi", "QSHARE_NODE_SHM_DIR": str(logs),
            "QSHARE_NODE_SEGMENT": f"qshare-scraped-{ports[2]}",
            "QSHARE_NODE_METRICS_PORT": str(ports[2])}, logs / "agent.log"),
        api := _service("qshare_api", {
            "QSHARE_API_DATABASE_URL": database_url, "QSHARE_API_NATS_URL": nats_url,
            "QSHARE_API_PORT": str(ports[3]), "QSHARE_API_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN,
        }, logs / "api.log"),
    ]  # fmt: skip
    try:
        _until_ready(f"http://127.0.0.1:{ports[3]}", api, logs / "api.log")
        yield [f"http://127.0.0.1:{port}/metrics" for port in ports]
    finally:
        for process in started:
            process.terminate()
            process.wait(10)


def _read() -> set[str]:
    """The series the PrometheusRule's alerts and the dashboard's panels and variables read."""
    documents = [d for p in MONITORING.glob("*.yaml") for d in yaml.safe_load_all(p.read_text())]
    exprs = [r["expr"] for d in documents if d["kind"] == "PrometheusRule"
             for g in d["spec"]["groups"] for r in g["rules"]]  # fmt: skip
    for d in documents:
        if d["kind"] == "ConfigMap":
            board: dict[str, Any] = json.loads(next(iter(d["data"].values())))
            exprs += [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
            exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return {m for e in exprs for m in SERIES.findall(e)}


def _served(url: str) -> set[str]:
    """The series names the families at `url` are read as."""
    for _ in range(100):
        try:
            text = httpx.get(url, timeout=2).text
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        pytest.fail(f"nothing answers on {url}")
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES[family.type]
    }


def test_every_series_the_monitoring_reads_is_served_by_a_running_service(
    metrics_urls: list[str],
) -> None:
    served = set().union(*(_served(url) for url in metrics_urls)) | {"up"}
    read = _read()
    assert len(read) > 20  # the alerts' and the panels' series were found
    assert read - served == set()
