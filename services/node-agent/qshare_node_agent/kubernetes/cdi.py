"""CDI spec files for prepared vGPUs: one spec per claim, whose devices set the vGPU's
environment and mount the interposer and the segment into the container."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from qshare import atomic_file
from qshare_driver.node import Policy
from qshare_node_agent.kubernetes.backend import LocalVgpu
from qshare_node_agent.kubernetes.container_env import vgpu_of

# The oldest CDI version holding what we write (env, mounts without a type, device nodes by
# path, names starting with a letter, no annotations): a runtime refuses a newer one than its
# CDI library knows, and every library knows 0.3.0.
CDI_VERSION = "0.3.0"
VENDOR = "qshare.io"
CLASS = "vgpu"
KIND = f"{VENDOR}/{CLASS}"
log = logging.getLogger(__name__)


def device_name(key: str) -> str:
    """A CDI device name for a prepared vGPU's key: letters, digits, '_', '.', '-', ':',
    starting and ending with a letter or digit (what CDI's parser accepts)."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", key)
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", name)


def qualified(name: str) -> str:
    return f"{KIND}={name}"


def spec(vgpus: list[LocalVgpu], policies: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The spec of `vgpus` (one claim's); `policies` (by vGPU key) the card policy each
    one's claim asked, recorded for a rebuild of the checkpoint. No device sets
    CUDA_VISIBLE_DEVICES: a runtime keeps one value of a variable that several devices set,
    so of a container's several claims one would win (docs/kubernetes.md). Each sets its
    card's QSHARE_VISIBLE_<index> instead, a name per card, from which the interposer sets
    CUDA_VISIBLE_DEVICES to every card of every claim."""
    asked = policies or {}
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [
            {"name": device_name(v.key), "containerEdits": edits(v, asked.get(v.key))}
            for v in vgpus
        ],
    }


def edits(vgpu: LocalVgpu, policy: str | None = None) -> dict[str, Any]:
    """The device's edits; a claim's policy is recorded in its environment (an annotation
    would need CDI 0.6.0, which a runtime of an older CDI library refuses)."""
    env = dict(vgpu.env)
    if policy is not None:
        env[POLICY_ENV] = policy
    out: dict[str, Any] = {"env": [f"{k}={v}" for k, v in env.items()]}
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


CLAIM_OWNER = "claim_"
"""A DRA claim's spec file is `qshare.io-claim_<uid>.json` (written by the DRA plugin)."""
POLICY_ENV = "QSHARE_CLAIM_POLICY"
"""The card policy a device's claim asked, in the device's environment (absent: none, or a
spec written before it was recorded)."""


class Recorded(NamedTuple):
    """A local vGPU as a claim's spec names it: its key, and the policy its claim asked."""

    key: str
    policy: str | None = None


def claim_specs(directory: Path) -> dict[str, Path]:
    """The claims' spec files in `directory` by claim uid (no other file: not another
    vendor's, nor a qshare spec of anything but a claim)."""
    prefix = f"{VENDOR}-{CLAIM_OWNER}"
    paths = sorted(directory.glob(f"{prefix}*.json"))
    return {p.name.removeprefix(prefix).removesuffix(".json"): p for p in paths}


def recorded_vgpus(directory: Path) -> dict[int, Recorded]:
    """vGPU id -> a key under its claim (`dra/<uid>/recovered/<device>`) and its claim's
    policy, read back from the claims' spec files: what a lost checkpoint named. Unreadable
    specs are skipped; a policy that cannot be read is taken as unknown."""
    found: dict[int, Recorded] = {}
    for uid, path in claim_specs(directory).items():
        try:
            found |= recorded_in(path, f"dra/{uid}/recovered/")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("CDI spec %s names no vGPU it can be rebuilt from: %r", path, exc)
    return found


def recorded_in(path: Path, prefix: str) -> dict[int, Recorded]:
    """vGPU id -> `prefix` + its device name, and its claim's policy, in one claim's spec;
    raises what reading it raised (OSError, or one of a spec of another shape)."""
    found: dict[int, Recorded] = {}
    for device in json.loads(path.read_bytes())["devices"]:
        env = _env_of(device["containerEdits"]["env"])
        found[_vgpu_id(env)] = Recorded(f"{prefix}{device['name']}", _policy(env, path))
    return found


def _vgpu_id(env: dict[str, str]) -> int:
    """The device's vGPU: its QSHARE_VGPU (every spec written so far sets it), else the one
    QSHARE_VGPU_<id> it sets; KeyError when it names none, or several."""
    if "QSHARE_VGPU" in env:
        return int(env["QSHARE_VGPU"])
    ids = [i for i in map(vgpu_of, env) if i is not None]
    if len(ids) != 1:
        raise KeyError(f"QSHARE_VGPU (the device sets {len(ids)} QSHARE_VGPU_<id> variables)")
    return ids[0]


def _temporary(path: str) -> str:
    """A temporary name beside `path` that no other write uses (this process's or another's)."""
    directory, _, name = path.rpartition("/")
    return f"{directory}/.{name}.{os.getpid()}-{secrets.token_hex(8)}.tmp"


@contextlib.contextmanager
def _logged_oserror(what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        log.error("%s: %s", what, exc.strerror)


def _env_of(env: list[str]) -> dict[str, str]:
    return {name: value for name, _, value in (item.partition("=") for item in env)}


def _policy(env: dict[str, str], path: Path) -> str | None:
    value = env.get(POLICY_ENV)
    if value is None:
        return None
    try:
        return Policy.parse(value).label
    except ValueError:
        log.warning("CDI spec %s records an unknown policy %r; taken as none", path, value)
        return None


class CdiWriter:
    """Writes and removes spec files `qshare.io-<owner>.json` in the CDI directory (made on
    the first write, and again if it was removed). Each write goes through a temporary file
    of its own, `.qshare.io-<owner>.json.<pid>-<random>.tmp` in the same directory (a name
    no runtime reads as a spec): two writes of one spec at once never share one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = f"{directory}/{VENDOR}-"

    def path(self, owner: str) -> Path:
        return Path(self._file(owner))

    def _file(self, owner: str) -> str:
        return f"{self._prefix}{device_name(owner)}.json"

    def write(
        self, owner: str, vgpus: list[LocalVgpu], policies: Mapping[str, str] | None = None
    ) -> Path:
        """Replace the owner's spec atomically (a runtime reading it sees the old or new
        whole: written to a temporary file, fsynced, renamed over it)."""
        path = self._file(owner)
        body = json.dumps(spec(vgpus, policies)).encode()
        try:
            atomic_file.replace(path, _temporary(path), body, durable=True)
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_file.replace(path, _temporary(path), body, durable=True)
        return Path(path)

    def remove_temporaries(self) -> list[str]:
        """Remove the temporary files writes killed before their rename left (call when no
        write runs: at start); returns their names. Another vendor's files stay."""
        removed: list[str] = []
        for path in sorted(self.directory.glob(f"*{VENDOR}-*.tmp")):
            if path.name.startswith((f".{VENDOR}-", f"{VENDOR}-")):
                with _logged_oserror(f"the temporary CDI file {path} could not be removed"):
                    path.unlink(missing_ok=True)
                    removed.append(path.name)
        return removed

    def remove(self, owner: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(owner))

    def remove_claims_except(self, kept: Collection[str]) -> list[str]:
        """Remove the spec of every claim not in `kept` (uids); returns the uids removed.
        One that cannot be removed is logged and left."""
        keep = {self.path(f"{CLAIM_OWNER}{uid}") for uid in kept}
        removed: list[str] = []
        for uid, path in claim_specs(self.directory).items():
            if path in keep:
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.error("the stale CDI spec %s could not be removed: %s", path, exc.strerror)
                continue
            removed.append(uid)
        return removed
