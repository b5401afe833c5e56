"""The prepared vGPUs on disk, next to the node segment, so a restarted agent keeps them.

The file names the segment it belongs to; a checkpoint of another segment is refused.
It is replaced atomically (write, fsync, rename): a crash leaves the old or the new one.
One that cannot be used (unreadable, not JSON, wrong shape, another segment, or values no
prepare writes: an id outside the node's own range, one vGPU under two keys) is moved aside
by `set_aside`, never deleted, so it can still be looked at.
Each entry is serialised once, when its vGPU is made; a save joins the stored texts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictInt, ValidationError, model_validator

from qshare import atomic_file
from qshare.contracts.agent import LOCAL_ID_LIMIT
from qshare.contracts.claims import MAX_MIB
from qshare.contracts.domain import MAX_CORE_SHARE, Priority
from qshare.contracts.nodes import MAX_CARDS

VERSION = 1
FIRST_LOCAL_ID = LOCAL_ID_LIMIT
LAST_LOCAL_ID = 0xFFFFFFFE
"""The ids of vGPUs prepared on the node; those below are the allocator's."""


class CheckpointError(Exception):
    """The checkpoint cannot be used; the message says why."""


class Entry(BaseModel):
    """One prepared vGPU, bounded as a prepare makes it: a restore never hands a claim an
    allocator's vGPU, nor passes the driver a number it cannot take."""

    key: Annotated[str, Field(min_length=1)]
    vgpu_id: Annotated[StrictInt, Field(ge=FIRST_LOCAL_ID, le=LAST_LOCAL_ID)]
    card_index: Annotated[StrictInt, Field(ge=0, lt=MAX_CARDS)]
    priority: Priority
    core_share: Annotated[StrictInt, Field(ge=1, le=MAX_CORE_SHARE)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MIB)]
    policy: Literal["best-effort", "fixed-share", "burst-share"] | None = None
    """The card policy the vGPU's claim asked (a restart gives it back to the card)."""


class Checkpoint(BaseModel):
    version: int = VERSION
    segment: str
    entries: list[Entry] = []

    @model_validator(mode="after")
    def _each_once(self) -> Checkpoint:
        """Each key and each vGPU once: two claims on one vGPU would release it twice."""
        for what in ("key", "vgpu_id"):
            values = [getattr(e, what) for e in self.entries]
            if len(set(values)) != len(values):
                raise ValueError(f"entries name a {what} more than once")
        return self


def checkpoint_path(segment_dir: Path, segment: str) -> Path:
    return segment_dir / f"qshare.{segment}.kubernetes.json"


def load(path: Path, segment: str) -> list[Entry]:
    """The entries saved for `segment`; none when there is no file yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc.strerror}") from None
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


def set_aside(path: Path, now: datetime | None = None) -> Path:
    """Rename an unusable checkpoint to `<name>.corrupt-<UTC time>`; returns the new path."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.replace(path, aside)
    return aside


def entry_json(entry: Entry) -> str:
    """One entry as `save` takes it: made once per vGPU, not on every save."""
    return entry.model_dump_json()


def save(path: Path, segment: str, entries: Iterable[str]) -> None:
    """Write the checkpoint of `entries` (each from `entry_json`), joined rather than
    serialised again: a save costs about the same with a hundred entries as with one."""
    head = json.dumps({"version": VERSION, "segment": segment})
    body = f'{head[:-1]}, "entries": [{",".join(entries)}]}}'.encode()
    atomic_file.replace(str(path), str(path.with_suffix(".tmp")), body, durable=True)
