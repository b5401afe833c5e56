"""`qshare run`: names the vGPU and preloads the interposer; limits stay in the segment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qshare.launcher import child_environment

from .conftest import INTERPOSER, LP_LIMIT, LP_VGPU, TOOLS, NodeOwner, parse_reply

# `qshare run` through its own parser, as the CLI registers it
RUN = (
    "import argparse, sys; from qshare import launcher; "
    "p = argparse.ArgumentParser(); launcher.register(p.add_subparsers()); "
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.handler(a))"
)


def test_child_environment_names_the_vgpu_and_preloads_the_interposer() -> None:
    env = child_environment({"LD_PRELOAD": "/other.so"}, 7, "seg", Path("/shm"), INTERPOSER)
    assert (env["QSHARE_VGPU"], env["QSHARE_SEGMENT"], env["QSHARE_SHM_DIR"]) == (
        "7",
        "seg",
        "/shm",
    )
    assert env["LD_PRELOAD"] == f"{INTERPOSER} /other.so"


def test_child_environment_does_not_pass_the_api_token_on() -> None:
    env = child_environment({"QSHARE_TOKEN": "qs_secret", "HOME": "/h"}, 7, "seg", None, INTERPOSER)
    assert "QSHARE_TOKEN" not in env and env["HOME"] == "/h"


def test_child_environment_drops_an_inherited_set_of_vgpus() -> None:
    """QSHARE_VGPU_<id> variables (from a container of several vGPUs, say) name a set the
    interposer reads in place of QSHARE_VGPU: before, they reached the program, which then
    ran on that set, not on the vGPU named here."""
    base = {"QSHARE_VGPU_9": "GPU-other", "QSHARE_VGPU_10": "GPU-x", "HOME": "/h"}
    env = child_environment(base, 7, "seg", None, INTERPOSER)
    assert not [k for k in env if k.startswith("QSHARE_VGPU_")]
    assert (env["QSHARE_VGPU"], env["HOME"]) == ("7", "/h")


def test_child_environment_carries_no_limits() -> None:
    env = child_environment({}, 7, "seg", None, INTERPOSER)
    assert set(env) == {"QSHARE_VGPU", "QSHARE_SEGMENT", "LD_PRELOAD"}


def test_run_executes_the_program_on_its_vgpu(node: NodeOwner) -> None:
    env = node.env(None)
    argv = [sys.executable, "-c", RUN, "run", "--vgpu", str(LP_VGPU), "--segment", node.name]
    argv += ["--shm-dir", str(node.directory), "--lib", str(INTERPOSER), "--"]
    argv += [str(TOOLS / "probe-direct"), "init", "meminfo"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    meminfo = parse_reply(done.stdout.splitlines()[1])
    assert int(meminfo["total"]) == LP_LIMIT


def test_run_without_a_command_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN, "run", "--vgpu", "1"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no command given" in done.stderr


def test_run_in_a_claim_without_a_command_shows_the_claim_form() -> None:
    claim = "00000000-0000-0000-0000-000000000001"
    done = subprocess.run(
        [sys.executable, "-c", RUN, "run", "--claim", claim, "--"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "(qshare run --claim ID -- CMD)" in done.stderr


def test_run_without_a_node_segment_fails_before_starting_the_program(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [sys.executable, "-c", RUN, "run", "--vgpu", "1", "--shm-dir", str(tmp_path), "--"]
    argv += ["touch", str(marker)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no node segment 'qshare'" in done.stderr and "qshare.qshare.cfg" in done.stderr
    assert not marker.exists()
