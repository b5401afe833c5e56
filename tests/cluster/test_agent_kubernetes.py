"""A node agent serving the kubelet's plugins (`kubernetes=True`) publishes its cards as they
are: a card that turns unhealthy, or whose policy a command changes, is published so in the
node's ResourceSlice (the DeviceClasses select healthy cards only), within a heartbeat."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as Nats

from qshare.contracts.domain import CardPolicy
from qshare.testing.kube_apiserver import ApiServerDouble
from qshare_node_agent.commands import PolicyCommand

from .conftest import StartAgent, eventually
from .test_node_commands import set_policy

NODE = f"k8s-{os.getpid()}"
SLICE = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-qshare-io"


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServerDouble]:
    """The API server double, and the plugins' settings pointing at it (set up before the
    agent, so torn down after it)."""
    server = ApiServerDouble()
    short = Path(tempfile.mkdtemp(prefix="qk8s-", dir="/tmp"))  # unix socket paths are short
    env = {
        "NODE_NAME": NODE, "API_SERVER": server.url, "TOKEN_FILE": str(short / "none"),
        "CA_FILE": str(short / "none"), "REGISTRY_DIR": str(short / "reg"),
        "PLUGIN_DIR": str(short / "plugin"), "DEVICE_PLUGIN_DIR": str(short / "dp"),
        "CDI_DIR": str(short / "cdi"), "VMEMORY_UNIT_MIB": "256", "SOCKET_CHECK_S": "0.05",
    }  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(f"QSHARE_K8S_{key}", value)
    yield server
    server.close()
    shutil.rmtree(short, ignore_errors=True)


def published(kube: ApiServerDouble, attribute: str) -> dict[str, Any]:
    """Each published device's `attribute`, by device name."""
    found = kube.objects.get(SLICE)
    if found is None:
        return {}
    devices = found["spec"]["devices"]
    return {d["name"]: next(iter(d["attributes"][attribute].values())) for d in devices}


async def test_a_card_that_turns_unhealthy_is_published_unhealthy(
    kube: ApiServerDouble, start_agent: StartAgent, tmp_path: Path
) -> None:
    sick = tmp_path / "unhealthy"
    agent = await start_agent(name=NODE, kubernetes=True, sim_unhealthy_file=sick)

    async def healthy(wanted: dict[str, bool]) -> bool:
        return published(kube, "healthy") == wanted

    await eventually(lambda: healthy({"gpu-0": True, "gpu-1": True}))
    sick.write_text(agent.cards[1].uuid)
    await eventually(lambda: healthy({"gpu-0": True, "gpu-1": False}))


async def test_a_policy_a_command_gives_a_card_is_published(
    kube: ApiServerDouble, start_agent: StartAgent, nc: Nats
) -> None:
    agent = await start_agent(name=NODE, kubernetes=True)

    async def policies(wanted: dict[str, str]) -> bool:
        return published(kube, "policy") == wanted

    await eventually(lambda: policies({"gpu-0": "best-effort", "gpu-1": "best-effort"}))
    command = PolicyCommand(gpu=agent.cards[0].uuid, policy=CardPolicy.FIXED_SHARE)
    await set_policy(nc, NODE, command)
    await eventually(lambda: policies({"gpu-0": "fixed-share", "gpu-1": "best-effort"}))
