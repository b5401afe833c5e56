"""CdiWriter: one spec file per owner, replaced whole, in a directory it makes when missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from qshare.contracts.domain import Priority
from qshare_node_agent.kubernetes import cdi
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.backend import LocalVgpu
from qshare_node_agent.kubernetes.cdi import CdiWriter, device_name
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import validate_cdi

VGPU = LocalVgpu("dra/u/gpu/gpu-0/s", 0x80000000, 0, "GPU-x", Priority.LOW, 10, 1024, "seg", "/s")


def test_the_spec_directory_is_made_again_after_it_was_removed(short_dir: Path) -> None:
    writer = CdiWriter(short_dir / "cdi")
    writer.write("claim_a", [VGPU])
    shutil.rmtree(short_dir / "cdi")
    path = writer.write("claim_a", [VGPU])
    validate_cdi(json.loads(path.read_text()))


def test_a_written_spec_leaves_no_temporary_file(short_dir: Path) -> None:
    writer = CdiWriter(short_dir / "cdi")
    writer.write("claim_a", [VGPU])
    writer.write("claim_a", [VGPU])
    assert [p.name for p in (short_dir / "cdi").iterdir()] == ["qshare.io-claim_a.json"]


def test_removing_a_spec_that_is_not_there_succeeds(short_dir: Path) -> None:
    CdiWriter(short_dir / "cdi").remove("claim_gone")


def test_a_device_name_from_a_key_ending_in_punctuation_is_a_valid_cdi_name() -> None:
    # CDI device names start and end with a letter or digit (the CDI parser's rule)
    for key in ("dra/u/gpu/gpu-0/share-", "dra/u/gpu/gpu-0/s.", "-dra/u/gpu/gpu-0/s:"):
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?", device_name(key)), key


def _lowest_cdi_version(spec: dict[str, Any]) -> str:
    """The oldest CDI version whose fields hold `spec` (CDI's rules for 0.4.0-0.6.0)."""
    devices = spec["devices"]
    edits = [d["containerEdits"] for d in devices] + [spec.get("containerEdits") or {}]
    annotated = spec.get("annotations") or any(d.get("annotations") for d in devices)
    if annotated or "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    digit_name = any(d["name"][:1].isdigit() for d in devices)
    if digit_name or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def test_a_spec_states_the_oldest_cdi_version_that_holds_it(short_dir: Path) -> None:
    # an older container runtime refuses a spec of a version newer than its CDI library knows
    path = CdiWriter(short_dir / "cdi").write("claim_a", [VGPU])
    spec = json.loads(path.read_text())
    assert spec["cdiVersion"] == _lowest_cdi_version(spec)


def test_a_spec_recording_a_claims_policy_is_valid_and_states_the_oldest_cdi_version(
    short_dir: Path,
) -> None:
    path = CdiWriter(short_dir / "cdi").write("claim_a", [VGPU], {VGPU.key: "fixed-share"})
    spec = json.loads(path.read_text())
    validate_cdi(spec)
    assert spec["cdiVersion"] == _lowest_cdi_version(spec)
    assert f"{cdi.POLICY_ENV}=fixed-share" in spec["devices"][0]["containerEdits"]["env"]


class Paused:
    """Holds the thread named `who` at its first `os.open` (once the file is open) and at its
    first `os.replace` (before it runs), each until the test lets it go on: pause points, the
    calls themselves run as they would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, who: str) -> None:
        self.at = {"open": threading.Event(), "replace": threading.Event()}
        self.go_on = {"open": threading.Event(), "replace": threading.Event()}
        self._who, self._open, self._replace = who, os.open, os.replace
        monkeypatch.setattr(os, "open", self.open)
        monkeypatch.setattr(os, "replace", self.replace)

    def open(self, *args: Any, **kwargs: Any) -> int:
        fd = self._open(*args, **kwargs)
        self._pause("open")
        return fd

    def replace(self, *args: Any, **kwargs: Any) -> None:
        self._pause("replace")
        self._replace(*args, **kwargs)

    def _pause(self, step: str) -> None:
        if threading.current_thread().name == self._who and not self.at[step].is_set():
            self.at[step].set()
            assert self.go_on[step].wait(10)

    def reach(self, step: str) -> None:
        assert self.at[step].wait(10), f"the writer never reached os.{step}"


def test_two_writes_of_one_spec_at_once_never_publish_a_torn_file(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, both writers used `<spec>.tmp`: the second truncated the first's temporary
    file and renamed it to the spec, then the first wrote its shorter body into that same
    file, now the published spec: a runtime reading it found the tail of the other write."""
    writer = CdiWriter(short_dir / "cdi")
    writer.write("claim_a", [VGPU])
    many = [replace(VGPU, key=f"{VGPU.key}-{i}") for i in range(4)]
    paused = Paused(monkeypatch, who="first")
    first = threading.Thread(target=writer.write, args=("claim_a", [VGPU]), name="first")
    first.start()
    paused.reach("open")
    writer.write("claim_a", many)  # the second write, whole, while the first's file is open
    paused.go_on["open"].set()
    paused.reach("replace")  # the first has written its body, not yet renamed it
    try:
        published = json.loads(writer.path("claim_a").read_text())  # whole, not torn
        assert len(published["devices"]) == len(many)
    finally:
        paused.go_on["replace"].set()
        first.join(10)
    assert len(json.loads(writer.path("claim_a").read_text())["devices"]) == 1


def test_a_temporary_file_left_by_a_crash_mid_write_is_removed_at_start(
    settings: KubernetesSettings, backend: LocalVgpus, kube_api: KubeApi
) -> None:
    """A write killed before its rename leaves its temporary file; before, nothing removed
    one (the next write of that claim reused the fixed name; a claim never written again
    kept it for good). Another vendor's files stay."""
    directory = settings.cdi_dir
    directory.mkdir(parents=True, exist_ok=True)
    left = ["qshare.io-claim_b.json.tmp", ".qshare.io-claim_c.json.1-ab.tmp"]
    others = ["nvidia.com-gpu.json", "nvidia.com-gpu.json.tmp"]
    for name in [*left, *others]:
        (directory / name).write_text("{")
    plugin = DraPlugin(settings, backend, kube_api)
    plugin.start()
    plugin.stop()
    assert sorted(p.name for p in directory.iterdir()) == others
