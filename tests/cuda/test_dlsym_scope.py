"""dlsym(RTLD_DEFAULT, ...) under the interposer answers as libc answers its caller: a
library loaded with RTLD_LOCAL (as Python loads extension modules) finds the symbols of its
own dependencies, with no error left for dlerror; a symbol that exists nowhere is not found."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from qshare.native_build import INTERPOSER, TOOLS


def scope_probe(preload: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = str(INTERPOSER)
    done = subprocess.run(
        [str(TOOLS / "scope-probe"), str(TOOLS / "libqsc-scope-user.so")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    head, *pairs = done.stdout.split()
    assert head == "scope"
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize("preload", [False, True], ids=["libc", "interposed"])
def test_a_locally_loaded_library_finds_its_dependencys_symbol_by_default_lookup(
    cuda_build: Path, preload: bool
) -> None:
    assert scope_probe(preload)["dep"] == "1"


@pytest.mark.parametrize("preload", [False, True], ids=["libc", "interposed"])
def test_a_symbol_that_exists_nowhere_is_not_found_by_default_lookup(
    cuda_build: Path, preload: bool
) -> None:
    assert scope_probe(preload)["missing"] == "0"
