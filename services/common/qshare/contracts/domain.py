"""Domain vocabulary shared by the services: priorities, placement policies, statuses, roles."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class Priority(StrEnum):
    """High priority is online work that preempts; low priority is offline work that yields."""

    HIGH = "high"
    LOW = "low"


class PlacementPolicy(StrEnum):
    """`spread` prefers the most free capacity; `binpack` the fullest that still fits."""

    SPREAD = "spread"
    BINPACK = "binpack"


class ClaimStatus(StrEnum):
    """Life cycle of a claim as the allocator records it."""

    PENDING = "pending"
    PLACED = "placed"
    READY = "ready"
    RELEASING = "releasing"
    RELEASED = "released"
    FAILED = "failed"


HOLDING_STATUSES = (ClaimStatus.PLACED.value, ClaimStatus.READY.value)
"""A claim in these statuses holds vGPUs (capacity on its cards). A `releasing` claim does
not: its capacity went back on delete, and it waits for its node to confirm that the vGPUs
left the segment."""

ENDED_STATUSES = (ClaimStatus.RELEASED.value, ClaimStatus.FAILED.value)
"""A claim in these statuses has ended: it holds nothing, and is kept as a record that goes
on naming its class."""


class NodeStatus(StrEnum):
    """A node is Ready while its heartbeats arrive within the allocator's timeout."""

    READY = "Ready"
    NOT_READY = "NotReady"


class Role(StrEnum):
    """`admin` sees everything and manages nodes, classes and tokens; `tenant` its own claims."""

    ADMIN = "admin"
    TENANT = "tenant"


class TokenScope(StrEnum):
    """`write` may do what the role allows; `read` may only read (GET)."""

    WRITE = "write"
    READ = "read"


class Provisioner(StrEnum):
    """How a class produces vGPUs: driver-level slices, or whole cards."""

    QSHARE = "qshare"
    WHOLE = "whole"


class CardPolicy(StrEnum):
    """Sharing policy among low-priority vGPUs on one card (node label `qshare.io/policy`)."""

    BEST_EFFORT = "best-effort"
    FIXED_SHARE = "fixed-share"
    BURST_SHARE = "burst-share"

    @classmethod
    def parse(cls, value: str) -> CardPolicy:
        """Accept the full names and the abbreviations `be`, `fs`, `bs`."""
        short = {"be": cls.BEST_EFFORT, "fs": cls.FIXED_SHARE, "bs": cls.BURST_SHARE}
        return short.get(value) or cls(value)


MAX_CORE_SHARE = 100
"""Core shares are integer percent of one card; each priority's shares sum to at most this."""

POLICY_LABEL = "qshare.io/policy"
NODE_LABEL = "qshare.io/node"
"""Every node agent labels its node with its name, so a claim can select one node."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""Kubernetes' own label of a Node's name: a node agent serving the kubelet registers it (the
scheduler extender places pods by it), and a DRA allocation may select its node by it."""
AGENT_FEATURES_LABEL = "qshare.io/agent-features"
"""What the node's agent can do beyond the first release's contract, comma-separated: a label,
so that a control plane of an earlier version stores it like any other."""
APPLY_SHARING_FEATURE = "apply-sharing"
"""The agent takes the sharing admins ask of its cards inside `cmd.apply` (an earlier agent
refuses an apply that carries it)."""
APPLY_SUSPENDED_FEATURE = "apply-suspended"
"""The agent takes each vGPU's `suspended` flag inside `cmd.apply` (an earlier agent refuses an
apply that carries it, so it gets none: a vGPU it creates runs until the preemptor's next
command about it)."""
PRIORITY_ANNOTATION = "qshare.io/priority"
VCORE_RESOURCE = "qshare.io/vcore"
VMEMORY_RESOURCE = "qshare.io/vmemory"


def agent_features(labels: Mapping[str, str]) -> frozenset[str]:
    """The features a node's agent announced in its labels (none for an earlier agent)."""
    return frozenset(
        f.strip() for f in labels.get(AGENT_FEATURES_LABEL, "").split(",") if f.strip()
    )
