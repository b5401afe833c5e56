"""Setting a card's compute timeslice (how long the GPU runs one process's work before it
switches to another's) with `nvidia-smi compute-policy`: the node agent at its start and
`qshare bench gpu` around its timeslice rows both set it through here."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

LEVELS: dict[str, int] = {"default": 0, "short": 1, "medium": 2, "long": 3}
"""nvidia-smi's `--set-timeslice` numbers."""
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Outcome:
    """One card's setting: `error` is None when it took effect, else why it did not."""

    uuid: str
    error: str | None = None


def timeslice_argv(program: str, uuid: str, level: str) -> list[str]:
    """The command that sets card `uuid` to `level` (ValueError naming an unknown level)."""
    if level not in LEVELS:
        raise ValueError(f"timeslice must be one of {sorted(LEVELS)}, not {level!r}")
    return [program, "compute-policy", "-i", uuid, "--set-timeslice", str(LEVELS[level])]


def set_timeslice(
    program: str, uuids: Sequence[str], level: str, timeout_s: float = TIMEOUT_S
) -> list[Outcome]:
    """Run `program compute-policy -i <uuid> --set-timeslice <N>` once per card. Never raises
    for the program's failures: each is in its card's outcome."""
    return [_set_one(program, uuid, level, timeout_s) for uuid in uuids]


def _set_one(program: str, uuid: str, level: str, timeout_s: float) -> Outcome:
    command = timeslice_argv(program, uuid, level)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=timeout_s
        )
    except FileNotFoundError:
        return Outcome(uuid, f"{program} not found")
    except subprocess.TimeoutExpired:
        return Outcome(uuid, f"{program} did not finish within {timeout_s:g} s")
    except OSError as error:  # not executable, and the like
        return Outcome(uuid, f"{program} could not run ({error.strerror or error})")
    if done.returncode != 0:
        said = _last_line(done.stderr) or _last_line(done.stdout) or "no message"
        return Outcome(uuid, f"{program} exited with status {done.returncode}: {said}")
    return Outcome(uuid)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
