"""The DRA plugin in a process of its own, on a segment of its own, so a test can kill it
with SIGKILL (a crash: no shutdown, no final save) and look at what it left on disk; or
have it kill itself as it asks the driver for its n-th vGPU, as it saves its checkpoint, or
as it destroys its n-th vGPU (a crash between two steps)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, make_node


def start(
    settings: KubernetesSettings,
    shm: Path,
    segment: str,
    die_at_create: int = 0,
    die_at_save: int = 0,
    die_at_destroy: int = 0,
) -> BaseProcess:
    """Start the plugin process; returns once its claim watch holds every stored claim.
    With `die_at_create` n, the process SIGKILLs itself as it asks for its n-th vGPU; with
    `die_at_save` n, as it saves its checkpoint the n-th time (a prepare's vGPUs and CDI
    spec made, not saved); with `die_at_destroy` n, as it asks the driver to destroy its
    n-th vGPU."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    config = settings.model_dump(mode="json")
    process = ctx.Process(
        target=_serve,
        args=(config, str(shm), segment, theirs, (die_at_create, die_at_save, die_at_destroy)),
    )
    process.start()
    if not mine.poll(30):
        process.kill()
        raise TimeoutError("the plugin process did not start in 30 s")
    mine.recv()
    return process


def _serve(
    settings: dict[str, Any],
    shm: str,
    segment: str,
    ready: Connection,
    die_at: tuple[int, int, int],
) -> None:
    config = KubernetesSettings.model_validate(settings)
    node = make_node(Path(shm), segment)
    die_at_create, die_at_save, die_at_destroy = die_at
    if die_at_create:
        node.create_vgpu = _dying(node.create_vgpu, die_at_create)  # type: ignore[method-assign]
    if die_at_destroy:
        node.destroy_vgpu = _dying(node.destroy_vgpu, die_at_destroy)  # type: ignore[method-assign]
    backend = LocalVgpus(node, CARDS)
    if die_at_save:
        backend.save = _dying(backend.save, die_at_save)  # type: ignore[method-assign]
    plugin = DraPlugin(config, backend, KubeApi(config.api_server, None, None, timeout_s=5))
    plugin.start()
    plugin.claims.synced.wait(10)
    ready.send(True)
    threading.Event().wait()


def _dying(call: Callable[..., None], n: int) -> Callable[..., None]:
    """`call`, but the n-th call kills the process (SIGKILL) before it runs."""
    calls = [0]

    def dying(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        call(*args)

    return dying
