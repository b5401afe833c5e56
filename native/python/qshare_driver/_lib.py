"""Loads the compiled cffi module and turns status codes into exceptions; private."""

from __future__ import annotations

from typing import Any

from qshare_driver.errors import error_for

try:
    from qshare_driver._ffi import ffi, lib
except ImportError as exc:  # pragma: no cover - only when the native build is missing
    raise ImportError("qshare_driver's native module is not built; run `make native`") from exc

__all__ = ["check", "ffi", "lib", "text", "u64"]

_U64_MAX = (1 << 64) - 1


def text(cdata: Any) -> str:
    return str(ffi.string(cdata).decode("utf-8", "replace"))


def u64(name: str, value: int) -> int:
    """`value` if a uint64_t argument can hold it, else a ValueError naming `name`."""
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be 0 to 2**64 - 1, got {value}")
    return value


def check(status: int) -> None:
    """Raise the typed exception for a failing status, with the driver's message."""
    if status != 0:
        raise error_for(status, text(lib.qs_last_error()))
