"""Keyset pages of the lists that answer a plain JSON array (tokens, quotas, nodes, cards):
`limit` and `cursor` as `GET /v1/claims` takes them; the next page's address comes in a
`Link: <…>; rel="next"` header. Without `limit` a list is answered whole, as before."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Query, Request, Response
from pydantic import AfterValidator, AwareDatetime, TypeAdapter, ValidationError

from qshare.contracts.errors import InvalidInput

T = TypeVar("T")
PageLimit = Annotated[
    int | None,
    Query(ge=1, le=500, description="items per page (default: all); the next page's address "
          "comes in the Link header (rel=\"next\")"),
]  # fmt: skip
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9000, 1, 1, tzinfo=UTC)


def _storable(when: datetime) -> datetime:
    """A time Postgres holds once converted to UTC (a cursor this API wrote always is)."""
    if not MIN_TIME <= when.astimezone(UTC) <= MAX_TIME:
        raise ValueError("out of range")
    return when


Stamp = Annotated[AwareDatetime, AfterValidator(_storable)]
"""A cursor's time."""

TIME_AND_ID = TypeAdapter(tuple[Stamp, uuid.UUID])
"""The key of lists in creation order (claims, tokens): the time, then the id."""


def encode(*key: object) -> str:
    """The cursor of the page after the item whose sort key is `key`."""
    text = json.dumps([_plain(k) for k in key])
    return base64.urlsafe_b64encode(text.encode()).decode()


def _plain(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return value if isinstance(value, int) else str(value)


def decode(cursor: str | None, shape: TypeAdapter[T]) -> T | None:
    """The sort key a cursor names, as `shape` (a tuple) says; anything this API did not
    write is a 422 naming `cursor`."""
    if cursor is None:
        return None
    try:
        return shape.validate_python(json.loads(base64.urlsafe_b64decode(cursor.encode())))
    except (ValueError, ValidationError, OverflowError) as exc:
        raise InvalidInput.on("cursor", "not a cursor returned by this API") from exc


def page(
    rows: Sequence[T], limit: int | None, key: Any, request: Request, response: Response
) -> list[T]:
    """The first `limit` of `rows` (read `limit + 1`); where there were more, the Link header
    names the next page: this request's with the cursor after the last row kept."""
    if limit is None or len(rows) <= limit:
        return list(rows)
    kept = list(rows[:limit])
    following = request.url.include_query_params(cursor=encode(*key(kept[-1])))
    response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return kept


def fetched(limit: int | None) -> int | None:
    """How many rows to read for a page of `limit`: one more, to know there is another."""
    return None if limit is None else limit + 1
