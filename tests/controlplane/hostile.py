"""Hostile variants of a valid request, for the fuzz tests of the NATS and REST edges: one
field at a time gone, or replaced by each of HOSTILE."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

HOSTILE: tuple[Any, ...] = (
    None, True, 0, -1, 2**31, 2**63, 2**70, 1.5, 1e308, -1e308, float("nan"), float("inf"),
    "", " ", "\x00", "é" * 300, "../../etc/passwd", "1e999Ti", [], {}, [None], {"": None},
)  # fmt: skip
"""What each field is replaced by, one at a time."""
GONE = object()
"""Stands for a field left out."""


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field and item of a JSON value, containers included, by their path."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
        value, list) else ()  # fmt: skip
    for key, inner in items:
        yield from _paths(inner, (*path, key))


def _mutated(seed: dict[str, Any], path: tuple[Any, ...], value: Any) -> Any:
    """`seed` with the field at `path` replaced by `value` (or left out: GONE)."""
    if not path:
        return value
    data = copy.deepcopy(seed)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if value is GONE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


def variants(seed: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(what was done, data) for each mutation of `seed`; an unknown field last."""
    for path in _paths(seed):
        where = ".".join(str(p) for p in path) or "data"
        for value in HOSTILE:
            yield f"{where} = {value!r:.40}", _mutated(seed, path, value)
        if path:
            yield f"{where} left out", _mutated(seed, path, GONE)
    yield "an unknown field", {**seed, "no_such_field": 1}
