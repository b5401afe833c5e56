"""Memory quantities: integer MiB, or Kubernetes quantities such as `4Gi`, `512Mi`, `8G`."""

from __future__ import annotations

import re
from fractions import Fraction

MIB = 1 << 20

_SUFFIXES: dict[str, int] = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}
_DECIMAL = {"k": 3, "M": 6, "G": 9, "T": 12, "P": 15}
"""The decimal suffixes, as powers of ten."""
MAX_QUANTITY_CHARS = 32
"""Longer strings are refused before any arithmetic (no quantity needs more)."""
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


class QuantityError(ValueError):
    """Raised for a memory quantity that is malformed, not positive or not whole MiB."""


def parse_mib(value: int | str) -> int:
    """Return a positive whole number of MiB.

    An int or a suffix-less numeric string means MiB; a suffixed string is a Kubernetes
    quantity in bytes (`4Gi` is 4096 MiB). Fractions of a MiB are refused, not rounded.
    """
    if isinstance(value, bool):
        raise QuantityError("must be an integer number of MiB or a quantity such as '4Gi'")
    if isinstance(value, int):
        return _positive(value)
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"must be at most {MAX_QUANTITY_CHARS} characters")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity such as 4096, '4Gi' or '512Mi'")
    number, suffix = match.group("number"), match.group("suffix")
    if suffix is None:
        if "." in number:
            raise QuantityError("a number without a suffix means MiB and must be whole")
        return _positive(int(number))
    try:
        return _positive(_bytes_to_mib(number, _SUFFIXES[suffix]))
    except QuantityError as exc:
        if suffix in _DECIMAL:  # `4G` is 4*10^9 bytes: almost always meant as `4Gi`
            raise QuantityError(f"{exc} ({value!r} is {number}x10^{_DECIMAL[suffix]} bytes; "
                                f"did you mean {number}{suffix.upper()}i?)") from None  # fmt: skip
        raise


_UNITS = (("TiB", 1 << 20), ("GiB", 1 << 10))
"""Units a size is shown in, largest first, with their size in MiB."""


def format_mib(mib: int) -> str:
    """MiB as people read them, for tables and messages (JSON keeps exact MiB): in the
    largest unit that shows it exactly with at most two decimals (`8 GiB`, `1.5 GiB`,
    `1.25 TiB`), else in MiB (`512 MiB`, `1100 MiB`)."""
    for unit, size in _UNITS:
        if abs(mib) >= size and mib * 100 % size == 0:
            return f"{mib / size:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{mib} MiB"


def _bytes_to_mib(number: str, unit: int) -> int:
    """Exact rational arithmetic: no precision limit, so no huge number can overflow it."""
    mib = Fraction(number) * unit / MIB
    if mib.denominator != 1:
        raise QuantityError("must be a whole number of MiB")
    return int(mib)


def _positive(mib: int) -> int:
    if mib <= 0:
        raise QuantityError("must be positive")
    return mib
