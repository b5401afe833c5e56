"""Changing and deleting a class in one transaction, its row locked: a claim created at the
same time either names the class before the delete counts it or is refused by the foreign
key after it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.errors import Conflict, InvalidInput, NotFound
from qshare.contracts.schema import claims, classes

BUILT_IN = ("qshare", "whole")
"""Seeded by the migrations; claims name `qshare` when they name none."""
FIXED = ("name", "provisioner")
"""A class's identity: claims hold vGPUs produced by its provisioner, and allocators keep
a class's provisioner once read."""


async def change_class(conn: AsyncConnection, name: str, change: dict[str, Any]) -> dict[str, Any]:
    """The class after `change` (by field); 404 where there is none, 422 naming a fixed
    field given another value."""
    current = await _locked(conn, name)
    for field in FIXED:
        if field in change and change[field] != current[field]:
            raise InvalidInput.on(
                field, f"a class's {field} cannot change (it is {current[field]!r}): "
                "add another class and name it in new claims",
            )  # fmt: skip
    values = {k: v for k, v in change.items() if k not in FIXED}
    if not values:
        return current
    statement = update(classes).where(classes.c.name == name).values(values)
    await conn.execute(statement)
    return current | values


async def delete_class(conn: AsyncConnection, name: str) -> None:
    """Delete the class; 404 where there is none, 409 for a built-in class or one that
    claims name (saying how many, by status)."""
    await _locked(conn, name)
    if name in BUILT_IN:
        raise Conflict(f"class {name} is built in: it cannot be deleted")
    if used := await _claims_by_status(conn, name):
        counts = ", ".join(f"{n} {status}" for status, n in sorted(used.items()))
        raise Conflict(
            f"class {name} is named by {sum(used.values())} claims ({counts}); claims keep "
            "their class, released ones too, so only a class no claim ever named can be deleted"
        )
    await conn.execute(delete(classes).where(classes.c.name == name))


async def _locked(conn: AsyncConnection, name: str) -> dict[str, Any]:
    """The class's row, locked until commit; NotFound naming it where there is none."""
    query = select(classes).where(classes.c.name == name).with_for_update()
    row = (await conn.execute(query)).one_or_none()
    if row is None:
        raise NotFound(f"class {name} not found")
    return dict(row._mapping)


async def _claims_by_status(conn: AsyncConnection, name: str) -> dict[str, int]:
    query = (
        select(claims.c.status, func.count())
        .where(claims.c.class_name == name)
        .group_by(claims.c.status)
    )
    return {status: n for status, n in (await conn.execute(query)).all()}
