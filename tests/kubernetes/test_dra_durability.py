"""A prepare answered OK is on disk: the plugin killed right after the answer (SIGKILL, no
shutdown) leaves the claim's vGPUs in the checkpoint and its CDI spec, and a restarted agent
keeps them. A claim whose save fails is refused and leaves nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qshare_driver.node import Node
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from . import plugin_process
from .conftest import CARDS, resource_claim, store_claim, wait_for
from .doubles import ApiServerDouble, KubeletDouble

SEGMENT = "crash-test"


@pytest.fixture
def stored(apiserver: ApiServerDouble) -> list[tuple[str, str, str]]:
    """Eight claims of 10 % of a card each, stored before the plugin starts: its watch
    holds them all, so every prepare is served on the plugin's loop and saved by a group
    commit."""
    small = {"memory": "2Gi", "cores": "10"}
    return [
        store_claim(apiserver, resource_claim(f"c{i}", small, device=f"gpu-{i % 2}"))
        for i in range(8)
    ]


@pytest.fixture
def plugin(
    settings: KubernetesSettings, shm: Path, stored: list[tuple[str, str, str]]
) -> Iterator[Any]:
    process = plugin_process.start(settings, shm, SEGMENT)
    yield process
    crash(process)


def crash(process: Any) -> None:
    process.kill()
    process.join()


def restored_claims(shm: Path) -> set[str]:
    """The claims a new agent adopting the crashed one's segment keeps."""
    with Node.adopt(SEGMENT, shm) as node:
        backend = LocalVgpus(node, CARDS)
        assert backend.restore() == []
        return {key.split("/")[1] for key in backend.prepared()}


def test_a_prepare_answered_ok_survives_a_crash_right_after(
    plugin: Any,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    stored: list[tuple[str, str, str]],
    shm: Path,
) -> None:
    claim = stored[0]
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    crash(plugin)
    assert restored_claims(shm) == {claim[2]}
    assert (settings.cdi_dir / f"qshare.io-claim_{claim[2]}.json").is_file()


def test_concurrent_prepares_answered_ok_all_survive_a_crash_right_after(
    plugin: Any,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    stored: list[tuple[str, str, str]],
    shm: Path,
) -> None:
    errors: dict[str, str] = {}

    def prepare(claim: tuple[str, str, str]) -> None:
        errors[claim[2]] = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error

    threads = [threading.Thread(target=prepare, args=(c,)) for c in stored]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    crash(plugin)
    assert set(errors.values()) == {""}
    assert restored_claims(shm) == {c[2] for c in stored}


def test_a_claim_whose_save_fails_is_refused_and_leaves_nothing(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    claim = store_claim(apiserver, resource_claim("unsaved"))
    wait_for(lambda: dra.claims.holds(*claim))  # served on the loop, saved by a group commit
    backend.checkpoint.with_suffix(".tmp").mkdir()  # the save's temporary file cannot be made
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert "could not be saved" in answer.error
    assert list(answer.devices) == []
    assert backend.prepared() == {}
    assert backend._node.list_vgpus() == []
    assert not dra.cdi.path(f"claim_{claim[2]}").exists()
    assert checkpoint.load(backend.checkpoint, backend._node.name) == []


def test_an_unprepare_whose_save_failed_is_saved_when_the_kubelet_retries_it(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """The retry finds nothing left to release, yet answers OK only once the checkpoint no
    longer names the claim: a restarted agent would otherwise bring its vGPU back."""
    claim = store_claim(apiserver, resource_claim("leaving"))
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    blocker = backend.checkpoint.with_suffix(".tmp")
    blocker.mkdir()  # the save's temporary file cannot be made
    assert (
        "Is a directory" in kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error
    )
    blocker.rmdir()
    assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert checkpoint.load(backend.checkpoint, backend._node.name) == []
