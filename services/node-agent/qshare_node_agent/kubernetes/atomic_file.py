"""Replacing a file whole: written beside it, then renamed over it, so a reader (or a crash)
sees the old contents or the new, never part of either."""

from __future__ import annotations

import os


def replace(path: str, tmp: str, body: bytes, *, durable: bool) -> None:
    """Write `body` to `tmp`, fsync it when `durable`, and rename it to `path`."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < len(body):
            written += os.write(fd, body[written:])
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
