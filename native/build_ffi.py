"""Build the cffi extension `qshare_driver._ffi` (API mode, out of line) from native/src.

Run by `make native`; never at import time.
"""

import os
import subprocess
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent

HEADER = ROOT / "include" / "qshare.h"
# Integer macros of the header that Python reads (lib.NAME, values from the compiled header).
CONSTANTS = (
    "QS_DEFAULT_LP_WINDOW_NS",
    "QS_LP_WINDOW_ALONE_NS",
    "QS_LP_DEVICE_GATE_SLICE_NS",
    "QS_RELEASE_AUTO_BUCKETS",
    "QS_RELEASE_AUTO_PERIOD_NS",
    "QS_VGPU_CREATE_SUSPENDED",
)


def cdef() -> str:
    """The public header, preprocessed: one source of truth for C callers and cffi."""
    cc = os.environ.get("CC", "cc")
    done = subprocess.run(
        [cc, "-E", "-P", "-DQS_CFFI_CDEF", str(HEADER)], capture_output=True, text=True, check=True
    )
    return done.stdout + "".join(f"#define {name} ...\n" for name in CONSTANTS)


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(cdef())
    sources = sorted(str(p) for p in (ROOT / "src").glob("*.c"))
    ffi.set_source(
        "qshare_driver._ffi",
        '#include "qshare.h"',
        sources=sources,
        include_dirs=[str(ROOT / "include"), str(ROOT / "src")],
        extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-D_GNU_SOURCE", "-pthread"],
        extra_link_args=["-pthread"],
    )
    return ffi


def main() -> None:
    ffi = builder()
    ffi.compile(tmpdir=str(ROOT / "build" / "ffi"), verbose=False)
    built = sorted((ROOT / "build" / "ffi" / "qshare_driver").glob("_ffi*.so"))
    target_dir = ROOT / "python" / "qshare_driver"
    for so in built:
        # A new inode, never a rewrite in place: running processes keep the old mapping.
        staged = target_dir / (so.name + ".new")
        staged.write_bytes(so.read_bytes())
        os.replace(staged, target_dir / so.name)


if __name__ == "__main__":
    main()
