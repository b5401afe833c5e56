"""Sizes shown to people (CLI tables, the API's messages): the largest unit that shows the
size exactly with at most two decimals, else MiB; JSON keeps exact MiB."""

from __future__ import annotations

import pytest

from qshare.contracts.quantities import format_mib, parse_mib


@pytest.mark.parametrize(
    ("mib", "shown"),
    [(512, "512 MiB"), (1024, "1 GiB"), (1536, "1.5 GiB"), (1280, "1.25 GiB"),
     (8192, "8 GiB"), (14848, "14.5 GiB"), (1100, "1100 MiB"), (1 << 20, "1 TiB"),
     (3 << 19, "1.5 TiB"), (100_000, "100000 MiB")],
)  # fmt: skip
def test_a_size_is_shown_in_the_largest_unit_that_shows_it_exactly(mib: int, shown: str) -> None:
    assert format_mib(mib) == shown


def test_every_size_shown_reads_back_as_exactly_itself() -> None:
    """No rounding: 1535 MiB is never shown as 1.5 GiB (checked for every size up to 4 GiB
    and around a TiB)."""
    sizes = [*range(1, 4 * 1024), *range((1 << 20) - 1024, (1 << 20) + 1024)]
    for mib in sizes:
        number, unit = format_mib(mib).split(" ")
        read = int(number) if unit == "MiB" else parse_mib(number + unit.removesuffix("B"))
        assert read == mib, format_mib(mib)
