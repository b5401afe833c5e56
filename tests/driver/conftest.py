"""Fixtures for the driver tests: a node segment in a private directory, and a way to
run workload processes (spawned, so that they share nothing but the segment)."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.context import SpawnProcess
from typing import Any

import pytest

from qshare_driver import Node

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def shm_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="qs")  # short: the owner's socket path must fit 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(shm_dir: str) -> Iterator[Node]:
    with Node.create(f"t{uuid.uuid4().hex[:8]}", shm_dir) as n:
        n.add_card(0, "GPU-sim-0", 16 * GiB)
        yield n


@pytest.fixture
def ctx() -> mp.context.SpawnContext:
    return mp.get_context("spawn")


@pytest.fixture
def spawn(ctx: mp.context.SpawnContext) -> Iterator[Callable[..., SpawnProcess]]:
    procs: list[SpawnProcess] = []

    def start(target: Callable[..., Any], *args: Any) -> SpawnProcess:
        p = ctx.Process(target=target, args=args, daemon=True)
        p.start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
