"""The classes a claim may name, cached per replica (classes are added, never changed)."""

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
        """How `name` produces vGPUs; an unknown class is invalid input on `class_name`."""
        if name not in self._known:
            query = select(classes.c.provisioner).where(classes.c.name == name)
            found = (await conn.execute(query)).scalar_one_or_none()
            if found is None:
                known = ", ".join(await _names(conn))
                raise InvalidInput.on("class_name", f"unknown class {name!r} (known: {known})")
            self._known[name] = Provisioner(found)
        return self._known[name]


async def _names(conn: AsyncConnection) -> list[str]:
    """Every class's name, for the error that names an unknown one."""
    return list((await conn.execute(select(classes.c.name).order_by(classes.c.name))).scalars())
