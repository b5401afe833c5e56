"""A segment left by an agent whose driver laid it out differently (an upgrade that changed the
driver's ABI) cannot be adopted. The agent then replaces it if no process has its
configuration part mapped or open any more (every attached process maps it), and otherwise
refuses to start, naming the processes to stop first: their limits live in the old segment."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from qshare_driver import DriverError

log = logging.getLogger(__name__)
SHOWN = 5
"""Processes named in a refusal (the rest are counted)."""
INIT_PID = 1
"""Not looked at: in the host's PID namespace (where the agent must run to adopt) it is the
node's init, never a process attached to a vGPU, and a sandbox's init may hide its mappings
even from root."""


class StaleSegmentInUse(DriverError):
    """The segment of an earlier layout still has attached processes (or may have: some could
    not be looked at); the message says what to do. A DriverError: the agent's start reports
    it as a segment refused ("cannot start: ...", exit 1)."""


@dataclass
class Holders:
    """The processes that have one file mapped or open, and those that could not be looked at."""

    pids: list[int] = field(default_factory=list)
    unreadable: list[int] = field(default_factory=list)


def cfg_path(directory: Path | None, name: str) -> Path:
    """The segment's configuration part (what every attached process holds a descriptor of)."""
    return (directory or Path("/dev/shm")) / f"qshare.{name}.cfg"


def holders(path: Path, proc: Path = Path("/proc")) -> Holders:
    """Every process but this one and init that has `path` open or mapped (by inode and
    device): an attached process keeps the part mapped and closes its descriptor."""
    found = Holders()
    try:
        target = path.stat()
    except FileNotFoundError:
        return found
    skipped = {os.getpid(), INIT_PID}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skipped:
            continue
        held = _holds(entry, target.st_ino, target.st_dev)
        if held is None:
            found.unreadable.append(int(entry.name))
        elif held:
            found.pids.append(int(entry.name))
    return found


def _holds(process: Path, ino: int, dev: int) -> bool | None:
    """Whether the process has the file open or mapped; None when that cannot be read (a
    process that is gone holds nothing)."""
    try:
        return _maps_hold(process / "maps", ino, dev) or _fds_hold(process / "fd", ino, dev)
    except FileNotFoundError:
        return False
    except PermissionError:
        return None


def _maps_hold(maps: Path, ino: int, dev: int) -> bool:
    """A line of /proc/<pid>/maps ("start-end perms offset MAJ:MIN inode path") maps the file."""
    for line in maps.read_text(errors="replace").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[4].isdigit() or int(fields[4]) != ino:
            continue
        major, _, minor = fields[3].partition(":")
        if os.makedev(int(major, 16), int(minor, 16)) == dev:
            return True
    return False


def _fds_hold(fds: Path, ino: int, dev: int) -> bool:
    for name in os.listdir(fds):
        try:
            st = os.stat(fds / name)
        except OSError:
            continue
        if (st.st_ino, st.st_dev) == (ino, dev):
            return True
    return False


def refusal(name: str, path: Path, why: str, found: Holders) -> str | None:
    """Why the stale segment must stay (the message for people), or None: it can go."""
    if found.pids:
        return (
            f"segment {name!r} ({path}) was made by a driver of another layout ({why}) and "
            f"{len(found.pids)} processes still use it ({_some(found.pids)}): stop them (drain "
            "the node's GPU workloads), then start this agent again; it replaces the segment "
            "once nothing uses it"
        )
    if found.unreadable:
        return (
            f"segment {name!r} ({path}) was made by a driver of another layout ({why}); "
            f"whether it is still used cannot be told: the mappings of "
            f"{len(found.unreadable)} processes cannot be read ({_some(found.unreadable)}). "
            "Run the agent as root (as deployed), or remove the segment's files once its "
            "workloads have stopped"
        )
    return None


def _some(pids: list[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:SHOWN])
    return f"pids {shown}" + (f" and {len(pids) - SHOWN} more" if len(pids) > SHOWN else "")


def check_replaceable(directory: Path | None, name: str, why: str) -> None:
    """Return when the stale segment may be replaced; raise StaleSegmentInUse otherwise."""
    path = cfg_path(directory, name)
    problem = refusal(name, path, why, holders(path))
    if problem is not None:
        raise StaleSegmentInUse(problem)
    log.warning("segment %r was made by a driver of another layout (%s) and no process uses "
                "it: replacing it", name, why)  # fmt: skip
