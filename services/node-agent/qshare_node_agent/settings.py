"""Node agent settings (env prefix `QSHARE_NODE_`), validated when built."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.bus import BusIdentity
from qshare.contracts.agent import LOCAL_ID_LIMIT
from qshare.contracts.claims import MAX_LABELS, Labels
from qshare.contracts.domain import (
    AGENT_FEATURES_LABEL,
    HOSTNAME_LABEL,
    NODE_LABEL,
    POLICY_LABEL,
    CardPolicy,
)
from qshare.contracts.nodes import (
    NODE_NAME_MAX,
    NODE_NAME_PATTERN,
    SEGMENT_NAME_MAX,
    SEGMENT_NAME_PATTERN,
    default_node_name,
)
from qshare.contracts.quantities import parse_mib
from qshare.contracts.sharing import Timeslice
from qshare.health import HealthSettings
from qshare.metrics_http import MetricsSettings
from qshare_driver import layout

if TYPE_CHECKING:
    from qshare_node_agent.kubernetes.config import KubernetesSettings

log = logging.getLogger(__name__)

SOCKET_PATH_MAX = 107
"""Bytes of a unix socket path (sun_path holds 108 with its NUL)."""

OWN_LABELS = (NODE_LABEL, POLICY_LABEL, AGENT_FEATURES_LABEL, HOSTNAME_LABEL)
"""The labels the agent sets on its node itself: placement (a claim's node selector, the
scheduler extender's node) and the allocator's choice of commands read them as the agent's."""
REGISTER_TIMEOUT_MAX_S = 300.0
"""A NATS request's wait: bounded, as every wait the agent's settings set."""

SIMULATE_FORMAT = re.compile(r"^(?P<cards>[0-9]{1,2})(:(?P<memory>[0-9]+(Ki|Mi|Gi|Ti)?))?$")
DEFAULT_SIM_MEMORY = "16Gi"


class NodeAgentSettings(BaseSettings, BusIdentity, HealthSettings, MetricsSettings):
    model_config = SettingsConfigDict(env_prefix="QSHARE_NODE_", extra="ignore")

    name: str = Field(
        default_factory=default_node_name,
        min_length=1,
        max_length=NODE_NAME_MAX,
        pattern=NODE_NAME_PATTERN,
        description="node name: labels of letters, digits, '-' and '_' joined by dots "
        "(a Kubernetes node name fits)",
    )
    simulate: str | None = Field(
        None, description="N[:MEM]: N simulated cards of MEM each (default 16Gi) instead of NVML"
    )
    segment: str | None = Field(
        None,
        description="driver segment name (default qshare-<name>): letters, digits, '-', '_' "
        "and '.', not starting with '.'",
    )
    shm_dir: Path | None = Field(None, description="segment directory (default /dev/shm)")
    labels: Labels = Field(
        default_factory=dict,
        description="the node's labels beside the agent's own, a JSON object (e.g. "
        f'{{"zone": "a"}}); the agent\'s own keys ({", ".join(OWN_LABELS)}) are refused, '
        f"and a registration holds at most {MAX_LABELS} labels with the agent's",
    )
    policy: CardPolicy = Field(
        CardPolicy.BEST_EFFORT,
        description="the cards' own sharing policy among low-priority vGPUs (best-effort, "
        "fixed-share, burst-share), under a DRA claim's, an admin's and the Node label's",
    )
    release_delay_s: float = Field(
        0.1, ge=0, le=60, description="release delay; with auto release, the longest it chooses"
    )
    release_auto_bound_s: float | None = Field(
        None, gt=0, le=1,
        description="auto release: the driver chooses each card's release delay, up to "
        "QSHARE_NODE_RELEASE_DELAY_S, so that high priority's p99 grows by at most this many "
        "seconds (docs/colocation.md); unset: the fixed QSHARE_NODE_RELEASE_DELAY_S",
    )  # fmt: skip
    lp_window_s: float = Field(
        0.0005, ge=1e-6, le=1.0,
        description="low priority's work in flight per process while high priority is "
        "attached, in estimated device time: what high priority may wait behind",
    )  # fmt: skip
    lp_device_gate: bool = Field(
        False,
        description="low priority's queued work waits on the card's gate on the GPU (the CUDA "
        "interposer's device gate; see docs/cuda.md)",
    )
    heartbeat_s: float = Field(
        5.0, gt=0, le=300, description="tell the allocator this often that the node lives"
    )
    register_timeout_s: float = Field(
        5.0, gt=0, le=REGISTER_TIMEOUT_MAX_S, description="wait this long for the allocator's "
        "answer to a registration (then try again)",
    )  # fmt: skip
    announce_interval_s: float = Field(
        1.0, ge=0, le=60,
        description="announce the cards' state again (qshare.nodes.announce) at most this often",
    )  # fmt: skip
    usage_interval_s: float = Field(
        5.0, ge=0, le=300, description="publish device-time usage this often; 0 = never"
    )
    kubernetes: bool = Field(
        False, description="also serve the kubelet's DRA and device-plugin sockets (QSHARE_K8S_*)"
    )
    keep_segment_on_stop: bool = Field(
        True,
        description="on stop, leave the segment for the next agent to adopt (workloads "
        "keep running); False removes it and every vGPU with it",
    )
    timeslice: Timeslice = Field(
        "driver",
        description="the cards' compute timeslice, set at start with `nvidia-smi compute-policy` "
        "(needs root; real cards only); driver: leave it as it is",
    )
    nvidia_smi: str = Field(
        "nvidia-smi", min_length=1, description="the program that sets the timeslice"
    )
    sim_unhealthy_file: Path | None = Field(
        None, description="simulated cards: a file listing UUIDs to report unhealthy (tests)"
    )

    @field_validator("simulate")
    @classmethod
    def _simulate_format(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = SIMULATE_FORMAT.match(value)
        if not match or not 1 <= int(match["cards"]) <= 16:
            raise ValueError(f"expected N[:MEM] with N in 1..16 and MEM like 80Gi, got {value!r}")
        if match["memory"] and parse_mib(match["memory"]) < 1024:
            raise ValueError(f"simulated card memory must be at least 1Gi, got {match['memory']}")
        return value

    @field_validator("labels")
    @classmethod
    def _not_own_labels(cls, value: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in value if k in OWN_LABELS)
        if taken:
            hint = " (a policy: QSHARE_NODE_POLICY)" if POLICY_LABEL in taken else ""
            raise ValueError(
                f"label {', '.join(taken)} is the node agent's own (it sets "
                f"{', '.join(OWN_LABELS)} itself); leave it out{hint}"
            )
        if len(value) + len(OWN_LABELS) > MAX_LABELS:
            raise ValueError(
                f"{len(value)} labels: a registration holds at most {MAX_LABELS} labels, "
                f"{len(OWN_LABELS)} of them the agent's own"
            )
        return value

    @field_validator("segment")
    @classmethod
    def _segment_format(cls, value: str | None) -> str | None:
        if value is not None and not (
            re.match(SEGMENT_NAME_PATTERN, value) and len(value) <= SEGMENT_NAME_MAX
        ):
            raise ValueError(
                f"a segment name is 1-{SEGMENT_NAME_MAX} letters, digits, '-', '_' and '.', "
                "not starting with '.'"
            )
        return value

    @property
    def segment_name(self) -> str:
        return self.segment or f"qshare-{self.name}"[:SEGMENT_NAME_MAX]

    @model_validator(mode="after")
    def _auto_has_room(self) -> NodeAgentSettings:
        problem = self.auto_release_problem()
        if problem is not None:
            raise ValueError(problem)
        return self

    def auto_release_problem(self) -> str | None:
        """Why auto release cannot run as set (no delay to choose up to), or None."""
        if self.release_auto_bound_s is not None and self.release_delay_s == 0:
            return (
                "release_auto_bound_s needs release_delay_s above 0: auto release chooses a "
                "delay up to release_delay_s"
            )
        return None

    @model_validator(mode="after")
    def _vgpu_sockets_fit(self) -> NodeAgentSettings:
        """vGPU socket paths must fit a unix socket address: refuse to start when not even
        vGPU 1's does (every apply would be refused), warn when the largest ids' do not."""
        if _path_bytes(self.vgpu_socket_path(1)) > SOCKET_PATH_MAX:
            raise ValueError(
                f"vGPU socket paths such as {self.vgpu_socket_path(1)} are over the "
                f"{SOCKET_PATH_MAX} bytes a unix socket allows: set a shorter "
                "QSHARE_NODE_SHM_DIR or QSHARE_NODE_SEGMENT"
            )
        largest = self.vgpu_socket_path(LOCAL_ID_LIMIT - 1)
        if _path_bytes(largest) > SOCKET_PATH_MAX:
            log.warning("vGPU socket paths reach %d bytes (%s): vGPUs with ids that long "
                        "will be refused", _path_bytes(largest), largest)  # fmt: skip
        return self

    def vgpu_socket_path(self, local_id: int) -> str:
        """Where the driver puts vGPU `local_id`'s socket."""
        return str(layout.vgpu_socket(self.segment_name, local_id, self.shm_dir))


def _path_bytes(path: str) -> int:
    return len(os.fsencode(path))


def load_agent_settings(
    given: Mapping[str, Any],
) -> tuple[NodeAgentSettings, KubernetesSettings | None]:
    """The agent's settings from command-line values (`given`, named by their flags in
    errors) over QSHARE_NODE_*, and its Kubernetes settings when it serves the kubelet (the
    allocator knows the node by the agent's name, the extender and the device plugin by the
    Kubernetes node's: they must be one); SettingsError naming every problem."""
    from qshare.envsettings import SettingsError, load
    from qshare_node_agent.kubernetes.config import KubernetesSettings

    flags = {k: "--" + k.replace("_", "-") for k in given}
    settings = load(NodeAgentSettings, dict(given), flags)
    if not settings.kubernetes:
        return settings, None
    k8s = load(KubernetesSettings)
    problems = []
    if k8s.node_name != settings.name:
        name = flags.get("name", "QSHARE_NODE_NAME")
        problems.append(
            f"{name}={settings.name!r}: the node agent serving the kubelet is named as its "
            f"Kubernetes node (QSHARE_K8S_NODE_NAME={k8s.node_name!r})"
        )
    problems += _node_labels_problems(k8s.node_labels, settings.labels)
    if problems:
        raise SettingsError(problems)
    return settings, k8s


def _node_labels_problems(mirrored: list[str], own: Mapping[str, str]) -> list[str]:
    """What is wrong with the Node's labels the agent registers (QSHARE_K8S_NODE_LABELS)
    beside QSHARE_NODE_LABELS and its own: each is registered once, and they fit together."""
    what = f"QSHARE_K8S_NODE_LABELS={json.dumps(mirrored)}"
    problems = []
    both = [k for k in mirrored if k in own]
    if both:
        problems.append(f"{what}: {both} are set by QSHARE_NODE_LABELS too; name each once")
    if len(mirrored) + len(own) + len(OWN_LABELS) > MAX_LABELS:
        problems.append(
            f"{what}: with QSHARE_NODE_LABELS' {len(own)} and the agent's {len(OWN_LABELS)}, "
            f"over the {MAX_LABELS} labels a registration holds"
        )
    return problems
