"""The classes a claim may name. A class some claim names is never deleted and no class's
provisioner changes, so a replica keeps what it read for stored claims; a new claim reads
its class afresh (it may have been deleted, or deleted and added again, since)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import Provisioner
from qshare.contracts.errors import InvalidInput
from qshare.contracts.schema import classes


class ClassCatalog:
    def __init__(self) -> None:
        self._known: dict[str, Provisioner] = {}

    async def provisioner(self, conn: AsyncConnection, name: str) -> Provisioner:
        """How a stored claim's class `name` produces vGPUs (kept once read)."""
        if name not in self._known:
            self._known[name] = await for_new_claim(conn, name)
        return self._known[name]


async def for_new_claim(conn: AsyncConnection, name: str, hold: bool = True) -> Provisioner:
    """How class `name` produces vGPUs, read now and, with `hold`, kept until commit (a delete
    waits for the claim and then counts it); an unknown class is invalid input on
    `class_name`. A preview, which locks nothing, does not hold it."""
    query = select(classes.c.provisioner).where(classes.c.name == name)
    if hold:
        query = query.with_for_update(key_share=True)
    found = (await conn.execute(query)).scalar_one_or_none()
    if found is None:
        known = ", ".join(await _names(conn))
        raise InvalidInput.on("class_name", f"unknown class {name!r} (known: {known})")
    return Provisioner(found)


async def _names(conn: AsyncConnection) -> list[str]:
    """Every class's name, for the error that names an unknown one."""
    return list((await conn.execute(select(classes.c.name).order_by(classes.c.name))).scalars())
