"""CDI spec files for prepared vGPUs: one spec per claim, whose devices set the vGPU's
environment and mount the interposer and the segment into the container."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from qshare_node_agent.kubernetes.backend import LocalVgpu

CDI_VERSION = "0.6.0"
VENDOR = "qshare.io"
CLASS = "vgpu"
KIND = f"{VENDOR}/{CLASS}"


def device_name(key: str) -> str:
    """A CDI device name for a prepared vGPU's key (letters, digits, '_', '.', '-', ':')."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", key.strip("/")).strip("_")


def qualified(name: str) -> str:
    return f"{KIND}={name}"


def spec(vgpus: list[LocalVgpu]) -> dict[str, Any]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": device_name(v.key), "containerEdits": edits(v)} for v in vgpus],
    }


def edits(vgpu: LocalVgpu) -> dict[str, Any]:
    out: dict[str, Any] = {"env": [f"{k}={v}" for k, v in vgpu.env.items()]}
    out["mounts"] = [
        {
            "hostPath": m.host_path,
            "containerPath": m.container_path,
            "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
        }
        for m in vgpu.mounts
    ]
    if vgpu.device_nodes:
        out["deviceNodes"] = [{"path": p} for p in vgpu.device_nodes]
    return out


class CdiWriter:
    """Writes and removes spec files `qshare.io-<owner>.json` in the CDI directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, owner: str) -> Path:
        return self.directory / f"{VENDOR}-{device_name(owner)}.json"

    def write(self, owner: str, vgpus: list[LocalVgpu]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(owner)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec(vgpus)))
        os.replace(tmp, path)
        return path

    def remove(self, owner: str) -> None:
        self.path(owner).unlink(missing_ok=True)
