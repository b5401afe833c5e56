"""The plugins' API client follows the kubelet's rotation of the service account token: a
projected token expires (an hour by default) and the kubelet writes a fresh one in its
place, which a client must read again, as client-go does."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi

from .doubles import ApiServerDouble

NODE_PATH = "/api/v1/nodes/node-a"


class AuthenticatingApiServer(ApiServerDouble):
    """The API server double, answering 401 Unauthorized to any bearer token but `valid`
    (as the real server answers an expired one)."""

    def __init__(self, valid: str) -> None:
        super().__init__()
        self.valid = valid
        double = self
        base: Any = self._server.RequestHandlerClass

        class Authenticating(base):  # type: ignore[misc,valid-type]
            def parse_request(self) -> bool:
                if not super().parse_request():
                    return False
                if self.headers.get("Authorization") == f"Bearer {double.valid}":
                    return True
                self._reply(401, {"kind": "Status", "code": 401, "message": "Unauthorized"})
                return False

        self._server.RequestHandlerClass = Authenticating


@pytest.fixture
def apiserver() -> Iterator[AuthenticatingApiServer]:
    server = AuthenticatingApiServer("first")
    server.put_object(NODE_PATH, {"kind": "Node", "metadata": {"name": "node-a"}})
    yield server
    server.close()


def rotate(token: Path, value: str) -> None:
    """As the kubelet does: a new file renamed over the old."""
    fresh = token.with_name("token.new")
    fresh.write_text(value)
    os.replace(fresh, token)


def test_a_rotated_token_is_used_once_the_old_one_expired(
    apiserver: AuthenticatingApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    api = KubeApi(apiserver.url, token, None, timeout_s=5)
    try:
        assert api.node("node-a")["metadata"]["name"] == "node-a"
        rotate(token, "second\n")
        apiserver.valid = "second"
        assert api.node("node-a")["metadata"]["name"] == "node-a"
    finally:
        api.close()


def test_a_watch_carries_the_rotated_token(
    apiserver: AuthenticatingApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    api = KubeApi(apiserver.url, token, None, timeout_s=5)
    rotate(token, "second")
    apiserver.valid = "second"
    try:
        watch = api.watch_resource_claims("0", 1)
        assert list(watch) == []
    except ApiError as exc:
        pytest.fail(f"the watch was refused: {exc}")
    finally:
        api.close()
