"""cuGetProcAddress honours the requested version for every _v2 memory entry: a request
below CUDA 3.2 (3020) means the v1 ABI with 32-bit slots, and is refused as not found (a v2
wrapper would overrun the caller's slot, an unwrapped v1 entry would escape the limit)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qshare.native_build import INTERPOSER

from .conftest import LP_VGPU, NodeOwner

V2_ENTRIES = ["cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem", "cuArrayCreate"]
V2_ENTRIES += ["cuMemAllocPitch", "cuArray3DCreate"]

# Asks the (preloaded) driver for `symbol` at `version` through cuGetProcAddress and through
# cuGetProcAddress_v2, and prints: rc, whether a pointer came back, whether it is the
# interposer's own _v2 wrapper.
LOOKUP = """
import ctypes, sys
symbol, version, interposer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cuda = ctypes.CDLL("libcuda.so.1")
ours = ctypes.CDLL(interposer)
wrapper = ctypes.cast(getattr(ours, symbol + "_v2"), ctypes.c_void_p).value
for fn, extra in ((cuda.cuGetProcAddress, ()), (cuda.cuGetProcAddress_v2, (ctypes.c_int(9),))):
    pfn = ctypes.c_void_p(0)
    rc = fn(symbol.encode(), ctypes.byref(pfn), version, ctypes.c_uint64(0),
            *(ctypes.byref(e) for e in extra))
    print(rc, pfn.value is not None, pfn.value == wrapper)
"""


def _lookup(node: NodeOwner, symbol: str, version: int) -> list[str]:
    env = node.env(LP_VGPU)
    env["LD_PRELOAD"] = str(INTERPOSER)
    argv = [sys.executable, "-c", LOOKUP, symbol, str(version), str(INTERPOSER)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("symbol", V2_ENTRIES)
def test_legacy_version_request_is_refused_as_not_found(node: NodeOwner, symbol: str) -> None:
    assert _lookup(node, symbol, 3010) == ["500 False False", "500 False False"]


@pytest.mark.parametrize("symbol", V2_ENTRIES)
def test_current_version_request_gets_the_v2_wrapper(node: NodeOwner, symbol: str) -> None:
    assert _lookup(node, symbol, 12000) == ["0 True True", "0 True True"]
