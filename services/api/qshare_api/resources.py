"""What the API holds while it runs (built in the lifespan) and the dependency that hands it out."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from nats.aio.client import Client
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare_api.events.slots import StreamSlots
from qshare_api.failures import FailedAuth
from qshare_api.ratelimit import RateLimiter
from qshare_api.settings import ApiSettings


@dataclass(frozen=True)
class Resources:
    """`engine` is for writes (explicit transactions); `reader` runs each read statement on
    its own (autocommit: no BEGIN/ROLLBACK round trips)."""

    settings: ApiSettings
    engine: AsyncEngine
    reader: AsyncEngine
    nc: Client
    limiter: RateLimiter
    streams: StreamSlots
    failures: FailedAuth

    @property
    def source(self) -> str:
        return f"qshare-api/{self.settings.instance}"


async def resources(request: Request) -> Resources:
    """Async, so FastAPI calls it on the event loop rather than in a worker thread."""
    found: Resources = request.app.state.resources
    return found
