"""Adding, changing and deleting a class in one transaction, its row locked: a claim created
at the same time either names the class before a delete counts it, or sees the class retired
(or is refused by the foreign key) after it. A class that claims have named is retired on
delete, not deleted: its ended claims keep naming it. Adding a class under a retired name
brings it back with the fields given, provided its provisioner is the same."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import ENDED_STATUSES
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


async def add_or_revive(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """Add the class, or bring a retired one of that name and provisioner back with `values`;
    409 where a class of that name is in use, or retired with another provisioner."""
    statement = insert(classes).values(values)
    revived = statement.on_conflict_do_update(
        index_elements=[classes.c.name],
        set_={field: statement.excluded[field] for field in values} | {"retired_at": None},
        where=classes.c.retired_at.is_not(None)
        & (classes.c.provisioner == statement.excluded.provisioner),
    )
    if (await conn.execute(revived.returning(classes.c.name))).first() is None:
        raise await _not_added(conn, values["name"])


async def _not_added(conn: AsyncConnection, name: str) -> Conflict:
    query = select(classes.c.provisioner, classes.c.retired_at).where(classes.c.name == name)
    found = (await conn.execute(query)).one()
    if found.retired_at is None:
        return Conflict(f"class {name} exists")
    return Conflict(
        f"class {name} is retired, and its ended claims' vGPUs were made by provisioner "
        f"{found.provisioner}: add it with that provisioner to bring it back, or choose "
        "another name"
    )


async def delete_class(conn: AsyncConnection, name: str) -> None:
    """Delete the class, or retire it where ended claims name it; 404 where there is none
    (or it is retired), 409 for a built-in class or one that claims not yet ended name
    (saying how many, by status)."""
    await _locked(conn, name)
    if name in BUILT_IN:
        raise Conflict(f"class {name} is built in: it cannot be deleted")
    used = await _claims_by_status(conn, name)
    if live := {status: n for status, n in used.items() if status not in ENDED_STATUSES}:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(live.items()))
        raise Conflict(
            f"class {name} is named by {sum(live.values())} claims not yet ended ({counts}): "
            "it can be deleted once they are released or failed"
        )
    if used:
        retire = update(classes).where(classes.c.name == name).values(retired_at=func.now())
        await conn.execute(retire)
    else:
        await conn.execute(delete(classes).where(classes.c.name == name))


async def _locked(conn: AsyncConnection, name: str) -> dict[str, Any]:
    """The class's row, locked until commit; NotFound naming it where there is none, or it
    is retired."""
    query = select(classes).where(classes.c.name == name, classes.c.retired_at.is_(None))
    # FOR UPDATE: it waits for, and makes wait, the key-share lock of a claim's write
    row = (await conn.execute(query.with_for_update())).one_or_none()
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
