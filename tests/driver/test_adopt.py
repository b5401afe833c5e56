"""A restarted node agent adopts the segment of an owner killed with SIGKILL: the vGPUs stay,
attached processes keep working and stay limited, and dead ones are reaped."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as MpEvent

import pytest

from qshare_driver import AlreadyExistsError, Client, EventKind, Node, OutOfMemoryError

GiB = 1 << 30
MiB = 1 << 20


def own_segment(name: str, directory: str, ready: MpEvent) -> None:
    """The first owner: one card, vGPUs 1 (low) and 2 (high); then waits to be killed."""
    node = Node.create(name, directory)
    node.add_card(0, "GPU-sim-0", 16 * GiB)
    node.create_vgpu(1, 0, "low", 50, GiB)
    node.create_vgpu(2, 0, "high", 50, GiB)
    ready.set()
    time.sleep(600)


def hold_memory(
    name: str, directory: str, ready: MpEvent, go: MpEvent, out: Queue[str], stop: MpEvent
) -> None:
    """Attach to vGPU 1 and reserve 600 MiB; after `go`, report what the limit still allows."""
    client = Client.attach(name, 1, directory)
    client.reserve(600 * MiB)
    ready.set()
    go.wait(60)
    try:
        client.reserve(600 * MiB)
        out.put("over the limit")
    except OutOfMemoryError:
        out.put("limited")
    client.reserve(100 * MiB)
    out.put(f"used {client.info().mem_used // MiB}")
    stop.wait(60)
    client.detach()
    out.put("detached")


def _owner(
    ctx: SpawnContext, spawn: Callable[..., SpawnProcess], name: str, d: str
) -> SpawnProcess:
    ready = ctx.Event()
    owner = spawn(own_segment, name, d, ready)
    assert ready.wait(30)
    return owner


def _kill(proc: SpawnProcess) -> None:
    os.kill(proc.pid or 0, signal.SIGKILL)
    proc.join(10)


def test_adopted_segment_keeps_its_cards_and_vgpus(
    shm_dir: str, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    owner = _owner(ctx, spawn, "adopt1", shm_dir)
    _kill(owner)
    with Node.adopt("adopt1", shm_dir) as node:
        assert node.list_cards() == [0]
        assert sorted(node.list_vgpus()) == [1, 2]
        assert node.vgpu_stats(1).mem_limit == GiB
        with Client.attach("adopt1", 2, shm_dir) as c:
            c.reserve(MiB)


def test_client_attached_before_the_owner_died_stays_limited_after_adopt(
    shm_dir: str, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    owner = _owner(ctx, spawn, "adopt2", shm_dir)
    ready, go, stop, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    spawn(hold_memory, "adopt2", shm_dir, ready, go, out, stop)
    assert ready.wait(30)
    _kill(owner)
    with Node.adopt("adopt2", shm_dir) as node:
        assert node.vgpu_stats(1).contexts == 1
        assert node.vgpu_stats(1).mem_used == 600 * MiB
        go.set()
        assert out.get(timeout=30) == "limited"
        assert out.get(timeout=30) == "used 700"
        stop.set()
        assert out.get(timeout=30) == "detached"
        assert node.vgpu_stats(1).contexts == 0
        assert node.vgpu_stats(1).mem_used == 0


def test_client_that_dies_after_adopt_is_reaped(
    shm_dir: str, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    owner = _owner(ctx, spawn, "adopt3", shm_dir)
    ready, go, stop, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    client = spawn(hold_memory, "adopt3", shm_dir, ready, go, out, stop)
    assert ready.wait(30)
    _kill(owner)
    with Node.adopt("adopt3", shm_dir) as node:
        _kill(client)
        deadline = time.monotonic() + 10
        kinds = []
        while time.monotonic() < deadline and EventKind.CLIENT_DIED not in kinds:
            ev = node.next_event(0.2)
            kinds += [ev.kind] if ev else []
        assert EventKind.CLIENT_DIED in kinds
        assert node.vgpu_stats(1).contexts == 0
        assert node.vgpu_stats(1).mem_used == 0


def test_client_that_died_with_the_owner_is_reaped_by_adopt(
    shm_dir: str, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    owner = _owner(ctx, spawn, "adopt4", shm_dir)
    ready, go, stop, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    client = spawn(hold_memory, "adopt4", shm_dir, ready, go, out, stop)
    assert ready.wait(30)
    _kill(owner)
    _kill(client)
    with Node.adopt("adopt4", shm_dir) as node:
        assert node.vgpu_stats(1).contexts == 0
        assert node.vgpu_stats(1).mem_used == 0


def test_adopt_is_refused_while_the_owner_lives(
    shm_dir: str, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    owner = _owner(ctx, spawn, "adopt5", shm_dir)
    with pytest.raises(AlreadyExistsError, match=f"process {owner.pid}, which is alive"):
        Node.adopt("adopt5", shm_dir)
    _kill(owner)
    with Node.adopt("adopt5", shm_dir) as node:
        assert sorted(node.list_vgpus()) == [1, 2]


def test_adopt_of_a_missing_segment_names_it(shm_dir: str) -> None:
    with pytest.raises(LookupError, match="no segment at"):
        Node.adopt("absent", shm_dir)


def test_bad_priority_string_is_a_value_error_naming_the_field(node: Node) -> None:
    with pytest.raises(ValueError, match="priority 'urgent'"):
        node.create_vgpu(1, 0, "urgent", 50, GiB)


def test_list_vgpus_follows_create_and_destroy(node: Node) -> None:
    node.create_vgpu(7, 0, "low", 10, GiB)
    node.create_vgpu(9, 0, "high", 10, GiB)
    assert sorted(node.list_vgpus()) == [7, 9]
    node.destroy_vgpu(7)
    assert node.list_vgpus() == [9]
    assert node.attach_dir(9).name.endswith(".v9")
