"""The prepared vGPUs on disk, next to the node segment, so a restarted agent keeps them.

The file names the segment it belongs to; a checkpoint of another segment is refused.
It is replaced atomically (write, fsync, rename): a crash leaves the old or the new one.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from qshare.contracts.domain import Priority

VERSION = 1


class CheckpointError(Exception):
    """The checkpoint cannot be used; the message says why."""


class Entry(BaseModel):
    key: str
    vgpu_id: int
    card_index: int
    priority: Priority
    core_share: int
    memory_mib: int


class Checkpoint(BaseModel):
    version: int = VERSION
    segment: str
    entries: list[Entry] = []


def checkpoint_path(segment_dir: Path, segment: str) -> Path:
    return segment_dir / f"qshare.{segment}.kubernetes.json"


def load(path: Path, segment: str) -> list[Entry]:
    """The entries saved for `segment`; none when there is no file yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        saved = Checkpoint.model_validate_json(raw)
    except ValidationError as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt: {exc.errors()[0]['msg']}") from None
    if saved.version != VERSION or saved.segment != segment:
        raise CheckpointError(
            f"checkpoint {path} is version {saved.version} of segment {saved.segment!r}; "
            f"expected version {VERSION} of {segment!r}"
        )
    return saved.entries


def save(path: Path, segment: str, entries: list[Entry]) -> None:
    body = Checkpoint(segment=segment, entries=entries).model_dump_json()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
