"""Replacing a file whole: written beside it, then renamed over it, so a reader (or a crash)
sees the old contents or the new, never part of either."""

from __future__ import annotations

import contextlib
import os


def replace(path: str, tmp: str, body: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """Write `body` to `tmp` with permissions `mode` from its first byte, fsync it when
    `durable`, and rename it to `path`; a failure removes `tmp` and leaves `path` as it was."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # a `tmp` left by an earlier run keeps its own otherwise
            written = 0
            while written < len(body):
                written += os.write(fd, body[written:])
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
