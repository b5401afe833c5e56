"""What a prepare gives back when it fails is what it made itself, as the backend tells it
under its own lock, never a guess from a look at the prepared vGPUs taken before: correct
even when two prepares of one claim ran side by side (the DRA server serializes them by
claim, `ClaimLocks`; this holds without that).

`Paused` is a test double over the real backend: its `prepare_all`, in the thread named
"first", waits for the test before it runs; and the first prepare's CDI write fails as a
full disk would (no real disk fails on demand). Everything else is real."""

from __future__ import annotations

import errno
import threading
from typing import Any

import pytest

from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.backend import VgpuWanted
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, resource_claim


class Paused(LocalVgpus):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = threading.Event()
        self.go_on = threading.Event()

    def prepare_all(self, wanted: list[VgpuWanted], *, durable: bool = True) -> Any:
        if threading.current_thread().name == "first":
            self.arrived.set()
            assert self.go_on.wait(10)
        return super().prepare_all(wanted, durable=durable)


def test_a_failed_prepare_beside_another_of_its_claim_gives_back_nothing_it_did_not_make(
    settings: KubernetesSettings, node: Any, kube_api: KubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `_prepare` took the prepared keys before asking the backend, outside its lock:
    the second prepare made the vGPU meanwhile, the first found it made and counted it as
    its own, and its failure destroyed the vGPU and removed the spec the second had just
    been answered with."""
    backend = Paused(node, CARDS, min_vgpu_mib=1024)
    dra = DraPlugin(settings, backend, kube_api)
    claim = resource_claim("shared")
    uid = claim["metadata"]["uid"]
    real_write = dra.cdi.write

    def write(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "first":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(dra.cdi, "write", write)
    failed: list[BaseException] = []
    first = threading.Thread(target=_prepare, args=(dra, claim, failed), name="first")
    first.start()
    assert backend.arrived.wait(10)
    answered = dra._prepare(claim, uid)  # the second, whole, meanwhile
    backend.go_on.set()
    first.join(10)
    assert [type(e) for e in failed] == [OSError]
    [(_, vgpu)] = answered.vgpus
    assert list(backend.prepared()) == [vgpu.key]
    assert dra.cdi.path(f"claim_{uid}").is_file()


def _prepare(dra: DraPlugin, claim: dict[str, Any], failed: list[BaseException]) -> None:
    try:
        dra._prepare(claim, claim["metadata"]["uid"])
    except OSError as exc:
        failed.append(exc)
