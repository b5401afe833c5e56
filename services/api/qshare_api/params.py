"""Query and path parameters bounded the way the stored values are, so bad ones get a 422."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from qshare.contracts.nodes import NODE_NAME_MAX, NODE_NAME_PATTERN

NO_NUL = r"^[^\x00]*$"
"""Postgres cannot store or compare a NUL character; refuse it at the edge."""

NodeFilter = Annotated[
    str | None,
    Query(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN, description="node"),
]
TenantFilter = Annotated[
    str | None, Query(min_length=1, max_length=128, pattern=NO_NUL, description="admins only")
]
CursorParam = Annotated[
    str | None,
    Query(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9_=-]+$", description="next_cursor"),
]
NodeName = Annotated[str, Path(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)]
CardUuid = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
