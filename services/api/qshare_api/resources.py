"""What the API holds while it runs (built in the lifespan) and the dependency that hands it out."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from nats.aio.client import Client
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare_api.settings import ApiSettings


@dataclass(frozen=True)
class Resources:
    settings: ApiSettings
    engine: AsyncEngine
    nc: Client

    @property
    def source(self) -> str:
        return f"qshare-api/{self.settings.instance}"


def resources(request: Request) -> Resources:
    found: Resources = request.app.state.resources
    return found
