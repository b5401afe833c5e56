"""The OpenTelemetry variables a platform team sets on every service: the service name it
asks for is the one its spans carry, and a sampler or sampling ratio qshare cannot use stops
each service at start with one line naming the variable, not a warning and sampling
everything, and not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .otlp_receiver import OtlpReceiver

NO_NATS = "nats://127.0.0.1:1"
SERVICES = {
    "qshare_allocator": {"QSHARE_ALLOCATOR_NATS_URL": NO_NATS},
    "qshare_api": {"QSHARE_API_NATS_URL": NO_NATS, "QSHARE_API_PORT": "1"},
    "qshare_preemptor": {"QSHARE_PREEMPTOR_NATS_URL": NO_NATS},
    "qshare_node_agent": {"QSHARE_NODE_NAME": "otel-1", "QSHARE_NODE_NATS_URL": NO_NATS,
                          "QSHARE_NODE_SIMULATE": "1:16Gi"},
}  # fmt: skip
BAD_SAMPLING = {
    "an unknown sampler": ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
    "a ratio above 1": (
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
        "OTEL_TRACES_SAMPLER_ARG='2'",
    ),
    "a ratio that is no number": (
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
        "OTEL_TRACES_SAMPLER_ARG='half'",
    ),
}
STARTED_WITHIN_S = 20


def _start(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The service's run, which a setting it refuses ends at once; one still running after
    `STARTED_WITHIN_S` accepted its settings."""
    try:
        return subprocess.run([sys.executable, "-m", module], env=os.environ | env,
                              capture_output=True, text=True, timeout=STARTED_WITHIN_S)  # fmt: skip
    except subprocess.TimeoutExpired as running:
        pytest.fail(f"{module} started anyway: {str(running.stderr)[-1000:]}")


def _refused(module: str, env: dict[str, str], named: str) -> None:
    done = _start(module, SERVICES[module] | env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("case", BAD_SAMPLING)
def test_bad_sampling_stops_the_allocator_naming_the_variable(case: str) -> None:
    env, named = BAD_SAMPLING[case]
    _refused("qshare_allocator", env, named)


@pytest.mark.parametrize("module", sorted(set(SERVICES) - {"qshare_allocator"}))
def test_every_service_refuses_a_sampling_ratio_above_1(module: str) -> None:
    env, named = BAD_SAMPLING["a ratio above 1"]
    _refused(module, env, named)


PROBE = """
from opentelemetry import trace
from qshare.contracts.tracing import flush_tracing, setup_tracing
setup_tracing("qshare-allocator")
with trace.get_tracer("probe").start_as_current_span("probe"):
    pass
flush_tracing()
"""


def _probe_service_name(env: dict[str, str]) -> set[str]:
    """The service names on the spans a process that set tracing up as a service does sent."""
    with OtlpReceiver() as receiver:
        env = env | {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        subprocess.run([sys.executable, "-c", PROBE], env=os.environ | env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        return {s.service for s in receiver.wait_for(bool, within_s=5)}


def test_otel_service_name_names_the_service_in_its_spans() -> None:
    assert _probe_service_name({"OTEL_SERVICE_NAME": "gpu-control-eu"}) == {"gpu-control-eu"}


def test_without_otel_service_name_the_spans_carry_qshares_name_for_the_service() -> None:
    assert _probe_service_name({}) == {"qshare-allocator"}
