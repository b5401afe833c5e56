"""The DRA plugin in a process of its own, on a segment of its own, so a test can kill it
with SIGKILL (a crash: no shutdown, no final save) and look at what it left on disk."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, make_node


def start(settings: KubernetesSettings, shm: Path, segment: str) -> BaseProcess:
    """Start the plugin process; returns once its claim watch holds every stored claim."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    process = ctx.Process(
        target=_serve, args=(settings.model_dump(mode="json"), str(shm), segment, theirs)
    )
    process.start()
    if not mine.poll(30):
        process.kill()
        raise TimeoutError("the plugin process did not start in 30 s")
    mine.recv()
    return process


def _serve(settings: dict[str, Any], shm: str, segment: str, ready: Connection) -> None:
    config = KubernetesSettings.model_validate(settings)
    backend = LocalVgpus(make_node(Path(shm), segment), CARDS)
    plugin = DraPlugin(config, backend, KubeApi(config.api_server, None, None, timeout_s=5))
    plugin.start()
    plugin.claims.synced.wait(10)
    ready.send(True)
    threading.Event().wait()
