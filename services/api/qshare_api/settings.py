"""API settings (env prefix `QSHARE_API_`), validated when built."""

from __future__ import annotations

import socket

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.settings import ClusterSettings
from qshare_api.extender.settings import ExtenderSettings


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QSHARE_API_", extra="ignore")

    database_url: str = "postgresql+asyncpg://qshare:qshare@localhost:5432/qshare"
    nats_url: str = "nats://localhost:4222"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    instance: str = Field(default_factory=socket.gethostname)
    pool_size: int = Field(
        20, ge=1, description="connections kept open (one per request in flight)"
    )
    allocator_timeout_s: float = Field(5.0, gt=0, description="wait this long for the allocator")
    max_body_bytes: int = Field(
        64 * 1024, ge=1024, description="larger bodies get a 422 problem document"
    )
    bootstrap_admin_token: SecretStr | None = Field(
        None, description="stored (hashed) as an admin token at start-up, for the first admin"
    )
    trace_console: bool = False
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    extender: ExtenderSettings = Field(default_factory=ExtenderSettings)
