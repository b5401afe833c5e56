"""The first admin's token (QSHARE_API_BOOTSTRAP_ADMIN_TOKEN[_FILE]), stored at start-up; on
a first apply the schema may not exist yet (the allocator's init container creates it), and
then it is stored once the schema is there while the API answers not ready meanwhile."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.domain import Role
from qshare.health import one_line, schema_revision, until_migrated
from qshare_api.tokens.repository import ensure_token

log = logging.getLogger(__name__)
AGAIN_S = 2.0
"""How often an API waiting for the schema looks again."""


async def bootstrap_admin(engine: AsyncEngine, secret: str | None) -> asyncio.Task[None] | None:
    """Store `secret` now when the schema is migrated; else a task that stores it once it is.
    Postgres out of reach fails the call (the service cannot start)."""
    if secret is None:
        return None
    if await schema_revision(engine) is not None:
        await _store(engine, secret)
        return None
    log.warning("the database schema is not migrated yet: the bootstrap admin token is "
                "stored once it is (python -m qshare_allocator migrate)")  # fmt: skip
    return asyncio.create_task(_once_migrated(engine, secret), name="bootstrap admin")


async def _store(engine: AsyncEngine, secret: str) -> None:
    async with engine.begin() as conn:
        stored = await ensure_token(conn, "bootstrap admin", "admin", Role.ADMIN, secret)
    if not stored:
        log.info("bootstrap admin token already issued once; the setting is ignored")


async def _once_migrated(engine: AsyncEngine, secret: str) -> None:
    """Store `secret` once the schema is there; Postgres away for now is waited out."""
    while True:
        await until_migrated(engine, AGAIN_S, on_error=_not_stored_yet)
        try:
            await _store(engine, secret)
        except Exception as exc:
            _not_stored_yet(exc)
            await asyncio.sleep(AGAIN_S)
        else:
            log.info("the schema is there: bootstrap admin token stored")
            return


def _not_stored_yet(exc: Exception) -> None:
    log.warning("bootstrap admin token not stored yet (%s)", one_line(exc))


def pending(task: asyncio.Task[None] | None) -> str | None:
    """Why the bootstrap admin token is not stored yet; None when it is (or none is set)."""
    if task is None:
        return None
    if not task.done():
        return "the bootstrap admin token waits for the schema"
    if task.cancelled() or task.exception() is not None:
        return "storing the bootstrap admin token failed; see the api logs"
    return None
