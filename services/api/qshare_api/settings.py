"""API settings (env prefix `QSHARE_API_`), validated when built."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

from pydantic import Field, IPvAnyNetwork, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from qshare.bus import BusIdentity, BusOptions
from qshare.dburl import DatabaseUrl
from qshare.envsettings import env_names
from qshare.metrics_http import MetricsSettings
from qshare.natsauth import ServiceRole
from qshare.settings import ClusterSettings
from qshare_api.extender.settings import ExtenderSettings


class ApiSettings(BaseSettings, BusIdentity, MetricsSettings):
    """`metrics_port` (off by default) serves /metrics on a port of its own, for a pod whose
    HTTP port Prometheus may not reach (the scheduler extender's)."""

    model_config = SettingsConfigDict(env_prefix="QSHARE_API_", extra="ignore")

    database_url: DatabaseUrl = Field(
        "postgresql+asyncpg://qshare:qshare@localhost:5432/qshare",
        description="Postgres, as psql takes it (postgres://, postgresql://, ?sslmode=, hosts)",
    )
    host: str = Field(
        "127.0.0.1", description="address the HTTP server binds (0.0.0.0 in containers)"
    )
    port: int = Field(8080, ge=1, le=65535, description="the HTTP port")
    instance: str = Field(default_factory=socket.gethostname, description="CloudEvents source")
    pool_size: int = Field(
        20, ge=1, description="connections kept open (one per request in flight)"
    )
    allocator_timeout_s: float = Field(5.0, gt=0, description="wait this long for the allocator")
    max_body_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=256 * 1024,
        description="larger bodies get a 422 problem document (bounded: NATS carries 1 MiB)",
    )
    bootstrap_admin_token: SecretStr | None = Field(
        None, description="stored (hashed) as an admin token at start-up, for the first admin"
    )
    bootstrap_admin_token_file: Path | None = Field(
        None, description="read the bootstrap admin token from this file instead"
    )
    rate_limit_per_s: float = Field(200.0, gt=0, description="requests per second per token")
    rate_limit_burst: int = Field(400, ge=1, description="requests a token may send at once")
    auth_failures_per_s: float = Field(
        2.0, gt=0, description="failed authentications (an unknown, revoked or expired token) "
        "per second per client address, on average; past the burst, a 429 before any lookup"
    )  # fmt: skip
    auth_failure_burst: int = Field(
        100, ge=1, description="failed authentications a client address may make at once"
    )
    trusted_proxies: Annotated[list[IPvAnyNetwork], NoDecode] = Field(
        default_factory=list,
        description="addresses or CIDR networks of proxies whose X-Forwarded-For names the "
        "client, comma-separated; none by default: the peer is the client",
    )
    token_recheck_s: float = Field(
        30.0, gt=0, description="an open `GET /v1/events` stream checks its token this "
        "often and ends once the token is revoked or expired"
    )  # fmt: skip
    max_event_streams_per_token: int = Field(
        16, ge=1, le=10_000, description="`GET /v1/events` streams one token may hold open at "
        "once (per API process); one more is a 429"
    )  # fmt: skip
    trace_console: bool = Field(False, description="also print every span on stderr")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    extender: ExtenderSettings = Field(default_factory=ExtenderSettings)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _listed(cls, value: object) -> object:
        """`10.0.0.0/8, 192.168.1.7` as an environment variable writes it."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("bootstrap_admin_token")
    @classmethod
    def _not_blank(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("is blank; leave it unset for no bootstrap admin token")
        return token

    def bus(self, name: str) -> BusOptions:
        """How this service connects to NATS, as `name`."""
        return self.bus_as(name, ServiceRole.API)

    def bootstrap_secret(self) -> str | None:
        """The bootstrap admin token, from the setting or its file; None when neither is set."""
        if self.bootstrap_admin_token is not None:
            return self.bootstrap_admin_token.get_secret_value()
        if self.bootstrap_admin_token_file is not None:
            token = self.bootstrap_admin_token_file.read_text().strip()
            if not token:  # stored, it would count as issued and the real one be ignored
                variable = env_names(type(self), "bootstrap_admin_token_file")[0]
                raise ValueError(f"{variable}={self.bootstrap_admin_token_file} is empty")
            return token
        return None
