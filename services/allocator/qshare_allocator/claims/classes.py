"""The classes a claim may name, kept per replica once read: a class's provisioner never
changes, and the statement that writes a new claim reads its class again, locked, so a class
retired, deleted or deleted and added again since it was kept is caught there."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import Provisioner
from qshare.contracts.errors import Conflict, InvalidInput
from qshare.contracts.schema import classes
from qshare.db import sqlstate

CLASS_KEY = "claims_class_name_fkey"
"""The claims -> classes foreign key: a claim written after its class was deleted breaks it."""


class ClassCatalog:
    def __init__(self) -> None:
        self._known: dict[str, Provisioner] = {}

    async def provisioner(self, conn: AsyncConnection, name: str) -> Provisioner:
        """How class `name` produces vGPUs (kept once read); an unknown or retired class is
        invalid input on `class_name`. A new claim's class is confirmed by `confirm`."""
        if name not in self._known:
            self._known[name] = await read_class(conn, name)
        return self._known[name]

    def confirm(self, name: str, used: Provisioner, held: Sequence[Any]) -> None:
        """Check the class a new claim's writes read locked (`held`, the rows of
        `held_class`: none when it was deleted, which its foreign key refuses anyway):
        refuse the claim when the class was retired since, or added again with another
        provisioner than the one `used` (kept from before it was deleted)."""
        if not held:
            self._known.pop(name, None)
            raise InvalidInput.on("class_name", f"class {name!r} was deleted")
        if held[0]["retired_at"] is not None:
            self._known.pop(name, None)
            raise InvalidInput.on("class_name", f"class {name!r} is retired")
        if held[0]["provisioner"] != used.value:
            self._known[name] = Provisioner(held[0]["provisioner"])
            raise Conflict(
                f"class {name} was deleted and added again with provisioner "
                f"{held[0]['provisioner']} while this claim was made: send it again"
            )


async def read_class(conn: AsyncConnection, name: str) -> Provisioner:
    """How class `name` produces vGPUs, read now without a lock; an unknown or retired class
    is invalid input on `class_name`."""
    query = select(classes.c.provisioner, classes.c.retired_at).where(classes.c.name == name)
    found = (await conn.execute(query)).one_or_none()
    if found is None:
        known = ", ".join(await _names(conn))
        raise InvalidInput.on("class_name", f"unknown class {name!r} (known: {known})")
    if found.retired_at is not None:
        raise InvalidInput.on("class_name", f"class {name!r} is retired")
    return Provisioner(found.provisioner)


@functools.cache
def held_class() -> Select[Any]:
    """The new claim's class (`k_class`): its provisioner and retirement, read key-share
    locked (the lock its foreign key takes anyway), so a retirement committed while the
    claim waited for it is seen. Built once."""
    query = select(classes.c.provisioner, classes.c.retired_at)
    query = query.where(classes.c.name == bindparam("k_class"))
    return query.with_for_update(read=True, key_share=True)  # without read: NO KEY UPDATE


def deleted_class(error: DBAPIError, name: str) -> InvalidInput | None:
    """The refusal of a claim whose class was deleted while it was made (the claims ->
    classes foreign key broken); None for any other failure."""
    cause = getattr(error.orig, "__cause__", None)
    if sqlstate(error) != "23503" or getattr(cause, "constraint_name", None) != CLASS_KEY:
        return None
    return InvalidInput.on("class_name", f"class {name!r} was deleted")


async def _names(conn: AsyncConnection) -> list[str]:
    """Every class's name but the retired ones, for the error that names an unknown one."""
    query = select(classes.c.name).where(classes.c.retired_at.is_(None)).order_by(classes.c.name)
    return list((await conn.execute(query)).scalars())
