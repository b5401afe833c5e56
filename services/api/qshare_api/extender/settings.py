"""Settings of the scheduler extender (env prefix `QSHARE_EXTENDER_`); off unless enabled."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.contracts.domain import HOSTNAME_LABEL

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ExtenderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QSHARE_EXTENDER_", extra="ignore")

    enabled: bool = Field(False, description="serve /extender/{filter,prioritize,bind}")
    api_server: str = Field(
        "https://kubernetes.default.svc", description="the Kubernetes API server (binds, pods)"
    )
    token_file: Path | None = Field(
        SERVICE_ACCOUNT / "token", description="bearer token for the API server (the pod's own)"
    )
    ca_file: Path | None = Field(
        SERVICE_ACCOUNT / "ca.crt",
        description="CA bundle the API server's certificate is checked against",
    )
    timeout_s: float = Field(5.0, gt=0, description="wait this long for the API server")
    vmemory_unit_mib: int = Field(
        256, ge=1, description="MiB per unit of qshare.io/vmemory (the node agents' "
        "QSHARE_K8S_VMEMORY_UNIT_MIB must be the same)",
    )  # fmt: skip
    reap_s: float = Field(30.0, gt=0, description="release claims of finished pods this often")
    settle_after_s: float = Field(
        300.0,
        ge=10,
        description="a claim of a live pod that its pod does not name while bound is given "
        "back once this old (a bind that failed or whose outcome was unknown)",
    )
    node_label: str = Field(
        HOSTNAME_LABEL, description="node agents register this label = node name"
    )
