"""`qshare run --vgpu ID -- CMD`: run an unmodified CUDA program on a vGPU (or, with
`--claim`, on every vGPU of a claim of several cards: one card per process).

It only names the vGPUs (QSHARE_VGPU, or one QSHARE_VGPU_<id>=<card uuid> each, with
QSHARE_SEGMENT and QSHARE_SHM_DIR) and preloads the interposer `libqshare-cuda.so`; the
limits themselves are read from the node segment, never from the environment, so the
program cannot raise them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qshare.native_build import INTERPOSER
from qshare_driver import layout

if TYPE_CHECKING:
    from qshare_api.claim_attach import Attachment

LIBRARY_NAME = "libqshare-cuda.so"
VGPU_PREFIX = "QSHARE_VGPU_"
"""`QSHARE_VGPU_<id>=<card uuid>`: one per vGPU of a process of several (the interposer's
set; when one is present, QSHARE_VGPU is not read)."""
DEFAULT_SEGMENT = "qshare"
_INSTALLED = Path("/usr/lib/qshare") / LIBRARY_NAME


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a CUDA program on a vGPU (LD_PRELOAD interposer)",
        description="Run CMD with the qshare CUDA interposer attached to vGPU ID.",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--claim", help="run in this claim, by its id or its first 8 hex digits or more (it "
        "must be ready, on this node)",
    )  # fmt: skip
    target.add_argument(
        "--vgpu", type=int, help="node-local: a vGPU id in the node's segment (no API needed)"
    )
    parser.add_argument(
        "--card", type=int,
        help="with --claim of several cards: run on this card's vGPU alone (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--url", default=os.environ.get("QSHARE_URL", "http://127.0.0.1:8080"),
        help="with --claim: the qshare API, or $QSHARE_URL (default http://127.0.0.1:8080)",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=os.environ.get("QSHARE_TOKEN"), help="with --claim: or $QSHARE_TOKEN"
    )
    parser.add_argument(
        "--segment", default=DEFAULT_SEGMENT,
        help=f"with --vgpu: the node segment (default {DEFAULT_SEGMENT}; "
        "a node agent's is qshare-<node>)",
    )  # fmt: skip
    parser.add_argument(
        "--shm-dir", type=Path,
        help="with --vgpu: the segment's directory (default /dev/shm or $QSHARE_SHM_DIR); "
        "with --claim: the directory the claim's node agent reported, this one if it reported none",
    )  # fmt: skip
    parser.add_argument("--lib", type=Path, help=f"path of {LIBRARY_NAME}")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    parser.set_defaults(handler=run_command)


def find_library(explicit: Path | None, env: Mapping[str, str]) -> Path | None:
    """The interposer: --lib, then $QSHARE_CUDA_LIB, the source tree's build, the install."""
    candidates = [explicit]
    if env.get("QSHARE_CUDA_LIB"):
        candidates.append(Path(env["QSHARE_CUDA_LIB"]))
    candidates.append(INTERPOSER)
    candidates.append(_INSTALLED)
    for path in candidates:
        if path is not None and path.is_file():
            return path.resolve()
    return None


def missing_segment(segment: str, shm_dir: Path | None, env: Mapping[str, str]) -> str | None:
    """Why the node segment cannot serve the program, or None: checked before it starts, so
    a program never runs unlimited because no node agent created the segment."""
    config = layout.config_file(segment, shm_dir, env)
    directory = config.parent
    if not config.is_file():
        return (
            f"no node segment {segment!r} in {directory} ({config.name} is missing); start "
            "the node (agent) first, or name it with --segment/--shm-dir"
        )
    return None


def child_environment(
    base: Mapping[str, str], vgpu: int, segment: str, shm_dir: Path | None, library: Path
) -> dict[str, str]:
    """The environment of the program: the vGPU's name and the preload, nothing else. The
    API token that looked the claim up is not passed on: the program has no use for it, and a
    workload is not to act on the cluster with its operator's rights. Inherited
    `QSHARE_VGPU_<id>` variables are dropped: they would name another set of vGPUs, which
    the interposer reads in place of QSHARE_VGPU."""
    env = {k: v for k, v in base.items() if k != "QSHARE_TOKEN" and not k.startswith(VGPU_PREFIX)}
    env["QSHARE_VGPU"] = str(vgpu)
    env["QSHARE_SEGMENT"] = segment
    if shm_dir is not None:
        env["QSHARE_SHM_DIR"] = str(shm_dir)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    env["LD_PRELOAD"] = " ".join([str(library), *(p for p in preload if p != str(library))])
    return env


def claim_environment(env: dict[str, str], found: Sequence[Attachment]) -> None:
    """Name the claim's vGPUs in `env` (the program's, from `child_environment`): its card
    alone for one vGPU, as before; for several, one QSHARE_VGPU_<id>=<card uuid> each and
    every card in CUDA_VISIBLE_DEVICES, in card order (QSHARE_VGPU, the first's, stays for
    an interposer that serves one vGPU)."""
    if len(found) > 1:
        env.update({f"{VGPU_PREFIX}{a.vgpu}": a.gpu_uuid for a in found})
    env["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(a.gpu_uuid for a in found))


def _from_claim(args: argparse.Namespace) -> None:
    """Fill --vgpu, --segment and --shm-dir from the claim (the API client is loaded here),
    and `args.found`, the claim's vGPUs the program runs on."""
    from qshare_api.claim_attach import AttachError, resolve, this_node
    from qshare_api.cli import claim_id, resolve_claim
    from qshare_api.client import Client

    client = Client(args.url, args.token)
    claim = resolve_claim(client, claim_id(args.claim), "--claim")
    found = resolve(client, claim, this_node(), args.card)
    if len({(a.segment, a.shm_dir) for a in found}) != 1:
        raise AttachError(f"claim {claim}: its vGPUs are not in one node segment")
    args.found = found
    args.vgpu, args.segment = found[0].vgpu, found[0].segment
    args.shm_dir = found[0].shm_dir if found[0].shm_dir is not None else args.shm_dir


def run_command(args: argparse.Namespace) -> int:
    cmd: list[str] = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        target = "--vgpu ID" if args.claim is None else "--claim ID"
        print(f"qshare run: no command given (qshare run {target} -- CMD)", file=sys.stderr)
        return 2
    if args.claim is not None:
        try:
            _from_claim(args)
        except Exception as exc:  # AttachError, ApiError, or the API out of reach
            print(f"qshare run: {exc}", file=sys.stderr)
            return 2
    if args.vgpu < 0:
        print(f"qshare run: --vgpu {args.vgpu} is not a vGPU id", file=sys.stderr)
        return 2
    if missing := missing_segment(args.segment, args.shm_dir, os.environ):
        print(f"qshare run: {missing}", file=sys.stderr)
        return 2
    library = find_library(args.lib, os.environ)
    if library is None:
        print(f"qshare run: {LIBRARY_NAME} not found; build it with `make native`", file=sys.stderr)
        return 2
    env = child_environment(os.environ, args.vgpu, args.segment, args.shm_dir, library)
    if args.claim is not None:
        claim_environment(env, args.found)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"qshare run: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process
