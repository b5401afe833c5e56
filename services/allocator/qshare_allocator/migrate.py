"""Run the Alembic migrations in `migrations/` against a database URL."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)


def alembic_config(url: str) -> Config:
    """Config for the repository's `alembic.ini` (or `$QSHARE_ALEMBIC_INI`) bound to `url`
    (percent-encoded characters in it, such as a socket path in `?host=`, are kept)."""
    default = Path(__file__).resolve().parents[3] / "alembic.ini"
    config = Config(os.environ.get("QSHARE_ALEMBIC_INI", str(default)))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ini interpolation
    config.attributes["configure_logger"] = False
    return config


async def upgrade(url: str, revision: str = "head") -> None:
    """`alembic upgrade head`, in a thread: env.py runs its own event loop."""
    await asyncio.to_thread(command.upgrade, alembic_config(url), revision)


def head(url: str) -> str | None:
    """The revision the migrations end at (what this image's code needs); None, with a
    warning, where the migrations cannot be read (an install without `alembic.ini`)."""
    try:
        return ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    except Exception as exc:
        log.warning("migrations not readable (%r): readiness checks only that the schema is "
                    "migrated, not that it is at their head", exc)  # fmt: skip
        return None
