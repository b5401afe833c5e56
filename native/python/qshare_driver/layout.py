"""Where the driver keeps a segment's files (native/src/segment.c's layout), for code that
checks or mounts them without opening the segment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_DIR = Path("/dev/shm")


def segment_dir(shm_dir: Path | None, env: Mapping[str, str] = os.environ) -> Path:
    """The directory the driver uses: `shm_dir`, else $QSHARE_SHM_DIR, else /dev/shm."""
    return shm_dir or Path(env.get("QSHARE_SHM_DIR") or DEFAULT_DIR)


def config_file(segment: str, shm_dir: Path | None, env: Mapping[str, str] = os.environ) -> Path:
    """The segment's configuration file, which exists while its owner has it."""
    return segment_dir(shm_dir, env) / f"qshare.{segment}.cfg"


def vgpu_dir(segment: str, vgpu_id: int, shm_dir: Path | None) -> Path:
    """vGPU `vgpu_id`'s attach directory, which holds its socket."""
    return segment_dir(shm_dir) / f"qshare.{segment}.v{vgpu_id}"


def vgpu_socket(segment: str, vgpu_id: int, shm_dir: Path | None) -> Path:
    return vgpu_dir(segment, vgpu_id, shm_dir) / "sock"
