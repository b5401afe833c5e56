"""The plugins' API server client over many failures: an API server away for hours (every
watch, publish and sweep retrying) must not grow the agent's memory with each try."""

from __future__ import annotations

import gc
import http.client

import pytest

from qshare.testing.servers import free_port
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi


def live_connections() -> int:
    gc.collect()
    return sum(isinstance(o, http.client.HTTPConnection) for o in gc.get_objects())


def test_requests_that_fail_keep_no_connection_alive() -> None:
    api = KubeApi(f"http://127.0.0.1:{free_port()}", timeout_s=1)  # nothing listens there
    before = live_connections()
    for _ in range(50):
        with pytest.raises(ApiError):
            api.request("GET", "/api/v1/nodes/node-a")
    assert live_connections() - before <= 1
    api.close()
