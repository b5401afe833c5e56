"""The plugins' background threads outlive an API server answer they cannot use (a 200 whose
body is not JSON, or JSON of another shape, as a proxy or a misbehaving server sends): each
logs it and asks again, instead of ending for good while the agent looks healthy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from qshare_node_agent.kubernetes import dra as dra_module
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi
from qshare_node_agent.kubernetes.claim_cache import ClaimCache
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes.plugins import KubernetesPlugins
from qshare_node_agent.kubernetes.slice_watch import SliceWatch

from .conftest import wait_for

BODIES = {
    "an HTML page": b"<html><body>502 Bad Gateway</body></html>",
    "a JSON list": b"[]",
    "a JSON string": b'"ok"',
    "no body": b"",
    "an object of another shape": b'{"items": "x"}',
}


class OddServer:
    """An HTTP server answering every request 200 with `body`; counts requests by path."""

    def __init__(self, body: bytes) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_PATCH = _answer

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,))
        self._thread.start()

    def asked(self, prefix: str) -> int:
        return sum(p.startswith(prefix) for p in list(self.paths))

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()


@pytest.fixture(params=BODIES.values(), ids=BODIES.keys())
def odd(request: pytest.FixtureRequest) -> Iterator[OddServer]:
    server = OddServer(request.param)
    yield server
    server.close()


@pytest.fixture
def odd_api(odd: OddServer) -> Iterator[KubeApi]:
    api = KubeApi(odd.url, timeout_s=5)
    yield api
    api.close()


@pytest.fixture
def odd_settings(settings: KubernetesSettings, odd: OddServer) -> KubernetesSettings:
    return settings.model_copy(update={"api_server": odd.url})


def test_an_answer_that_is_not_json_is_an_api_error() -> None:
    server = OddServer(BODIES["an HTML page"])
    api = KubeApi(server.url, timeout_s=5)
    try:
        with pytest.raises(ApiError, match="not a JSON object"):
            api.request("GET", "/api/v1/nodes/node-a")
    finally:
        api.close()
        server.close()


def test_the_claim_watch_lists_again_after_an_answer_it_cannot_use(
    odd: OddServer, odd_api: KubeApi
) -> None:
    cache = ClaimCache(odd_api, watch_s=1, retry_s=0.01)
    cache.start()
    try:
        wait_for(lambda: odd.asked("/apis/resource.k8s.io/v1/resourceclaims") >= 3)
    finally:
        cache.stop()


def test_the_slice_watch_lists_again_after_an_answer_it_cannot_use(
    odd: OddServer, odd_api: KubeApi
) -> None:
    watch = SliceWatch(odd_api, "node-a-qshare-io", lambda: None)
    watch.start()
    try:
        wait_for(lambda: odd.asked("/apis/resource.k8s.io/v1/resourceslices?") >= 3)
    finally:
        watch.stop()


def test_the_slice_is_published_again_after_an_answer_it_cannot_use(
    odd: OddServer,
    odd_api: KubeApi,
    odd_settings: KubernetesSettings,
    backend: LocalVgpus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dra_module, "RETRY_PUBLISH_S", 0.01)
    plugin = DraPlugin(odd_settings, backend, odd_api)
    plugin.start()
    try:
        wait_for(lambda: odd.asked("/apis/resource.k8s.io/v1/resourceslices/") >= 3)
    finally:
        plugin.stop()


def test_the_pod_sweep_goes_on_after_an_answer_it_cannot_use(
    odd: OddServer, odd_settings: KubernetesSettings, backend: LocalVgpus
) -> None:
    plugins = KubernetesPlugins(odd_settings, backend, sweep_s=0.01)
    plugins.start()
    try:
        wait_for(lambda: odd.asked("/api/v1/pods?") >= 3)
    finally:
        plugins.stop()
