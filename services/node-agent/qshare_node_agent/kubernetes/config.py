"""Settings of the node agent's Kubernetes plugins (env prefix `QSHARE_K8S_`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare_node_agent.settings import OWN_LABELS

DRIVER = "qshare.io"
IN_CLUSTER_SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*")
"""A Kubernetes object name (a Node's, a ResourceClaim's) and a DRA driver's name."""
DNS_SUBDOMAIN_MAX = 253
LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
"""A Kubernetes label key's name part (after the optional `prefix/`)."""


class KubernetesSettings(BaseSettings):
    """Where the kubelet looks for plugins, where CDI specs go, and how to reach the API server."""

    model_config = SettingsConfigDict(env_prefix="QSHARE_K8S_", extra="ignore")

    node_name: str = Field(..., min_length=1, description="this node's Kubernetes name")
    driver: str = Field(DRIVER, description="the DRA driver's name (its DeviceClasses select it)")
    registry_dir: Path = Field(
        Path("/var/lib/kubelet/plugins_registry"), description="the kubelet's plugin registry"
    )
    plugin_dir: Path = Field(
        Path("/var/lib/kubelet/plugins/qshare.io"), description="where the DRA socket is served"
    )
    device_plugin_dir: Path = Field(
        Path("/var/lib/kubelet/device-plugins"), description="the kubelet's device-plugin sockets"
    )
    cdi_dir: Path = Field(Path("/var/run/cdi"), description="where the CDI specs are written")
    api_server: str = Field(
        "https://kubernetes.default.svc",
        description="the Kubernetes API server (ResourceSlices, claims, pods)",
    )
    token_file: Path | None = Field(
        IN_CLUSTER_SA / "token", description="bearer token for the API server (the pod's own)"
    )
    ca_file: Path | None = Field(
        IN_CLUSTER_SA / "ca.crt",
        description="CA bundle the API server's certificate is checked against",
    )
    api_timeout_s: float = Field(  # a socket's timeout: bounded
        5.0, gt=0, le=300, description="wait this long for the API server"
    )
    min_vgpu_mib: int = Field(1024, ge=1, description="smallest memory a claim may consume")
    socket_check_s: float = Field(
        1.0, gt=0, le=60, description="how often a vanished socket is noticed"
    )
    vmemory_unit_mib: int = Field(
        256, ge=1, description="MiB per qshare.io/vmemory device the device plugin advertises "
        "(the scheduler extender's QSHARE_EXTENDER_VMEMORY_UNIT_MIB must be the same); at 1 MiB "
        "one 80 GiB card's list is over the kubelet's 4 MiB message limit",
    )  # fmt: skip
    node_labels: list[str] = Field(
        default_factory=list,
        description="keys of the Kubernetes Node's labels the agent registers as its node's "
        '(a JSON list, e.g. ["topology.kubernetes.io/zone"]), read every heartbeat period '
        "and registered again when they change",
    )
    workers: int = Field(
        16, ge=1, description="gRPC worker threads per threaded plugin socket (the device "
        "plugin's and registration's; the DRA socket is served on an event loop)",
    )  # fmt: skip

    unhealthy_taint_effect: Literal["NoSchedule", "NoExecute", "None"] = Field(
        "NoSchedule", description="the effect of the `qshare.io/unhealthy` taint an unhealthy "
        "card's device gets in the ResourceSlice: NoSchedule keeps new claims off it; NoExecute "
        "also evicts the pods already using it (a health read that fails marks every card "
        "unhealthy, so this can evict a whole node's pods); None only informs",
    )  # fmt: skip
    health_service: bool = Field(
        True, description="serve the kubelet's DRA resource-health service (NodeWatchResources, "
        "dra-health v1 and v1alpha1) on the DRA socket and list it in the registration",
    )  # fmt: skip
    health_resend_s: float = Field(
        10.0, gt=0, le=20, description="how often the health stream repeats every device's "
        "health (the kubelet counts a device unheard of for 30 s as Unknown)",
    )  # fmt: skip

    @field_validator("node_name", "driver")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        """They go into API paths and socket file names as they are."""
        if len(value) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                "expected a DNS name: lower-case letters, digits, '-' and '.', starting and "
                f"ending with a letter or digit, at most {DNS_SUBDOMAIN_MAX}"
            )
        return value

    @field_validator("node_labels")
    @classmethod
    def _label_keys(cls, value: list[str]) -> list[str]:
        """Each a Kubernetes label key, once: any other could never name a Node's label."""
        wrong = [k for k in value if not _label_key(k)]
        if wrong:
            raise ValueError(
                f"{wrong} are not Kubernetes label keys ([prefix/]name: a DNS name, then 1-63 "
                "letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
            )
        if len(set(value)) != len(value):
            raise ValueError("a label key is named more than once")
        taken = [k for k in value if k in OWN_LABELS]
        if taken:
            raise ValueError(
                f"{taken} are the node agent's own labels (it sets {', '.join(OWN_LABELS)} "
                "itself); leave them out"
            )
        return value

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"


def _label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return LABEL_NAME.fullmatch(name) is not None
