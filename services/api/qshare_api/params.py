"""Query and path parameters bounded the way the stored values are, so bad ones get a 422."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import Field, StrictStr

from qshare.contracts.nodes import NODE_NAME_MAX, NODE_NAME_PATTERN

TENANT_MAX = 128
TENANT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\s]([^\x00-\x1f\x7f-\x9f]*[^\x00-\x1f\x7f-\x9f\s])?$"
"""The one rule for a tenant's name, wherever it is given (token, filter, quota): not blank,
no leading or trailing whitespace, no control characters."""

TenantName = Annotated[
    StrictStr, Field(min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN)
]
TenantPath = Annotated[str, Path(min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN)]
TenantFilter = Annotated[
    str | None,
    Query(min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN, description="admins only"),
]
NodeFilter = Annotated[
    str | None,
    Query(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN, description="node"),
]
CursorParam = Annotated[
    str | None,
    Query(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9_=-]+$", description="next_cursor"),
]
NodeNameText = Annotated[
    StrictStr, Field(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)
]
NodeName = Annotated[str, Path(min_length=1, max_length=NODE_NAME_MAX, pattern=NODE_NAME_PATTERN)]
CardUuid = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
