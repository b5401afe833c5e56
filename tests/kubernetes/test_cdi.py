"""CdiWriter: one spec file per owner, replaced whole, in a directory it makes when missing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from qshare.contracts.domain import Priority
from qshare_node_agent.kubernetes import cdi
from qshare_node_agent.kubernetes.backend import LocalVgpu
from qshare_node_agent.kubernetes.cdi import CdiWriter, device_name

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
