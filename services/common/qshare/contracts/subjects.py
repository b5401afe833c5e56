"""NATS subjects, queue groups and the JetStream stream that carries events.

A node name may hold dots (Kubernetes node names are DNS subdomains, e.g. EKS's
`ip-10-0-0-1.ec2.internal`); in a subject it is one token, with each dot written `~`
(`qshare.node.ip-10-0-0-1~ec2~internal.heartbeat`). Node names never hold `~`."""

from __future__ import annotations

from typing import Final

CLAIMS_CREATE: Final = "qshare.allocator.claims.create"
CLAIMS_DELETE: Final = "qshare.allocator.claims.delete"
CLAIMS_RESIZE: Final = "qshare.allocator.claims.resize"
NODES_REGISTER: Final = "qshare.allocator.nodes.register"
CLAIMS_SUSPEND: Final = "qshare.preemptor.claims.suspend"
CLAIMS_RESUME: Final = "qshare.preemptor.claims.resume"
GPU_EVENTS: Final = "qshare.evt.gpu.>"
PREEMPTOR_QUEUE: Final = "qshare-preemptor"
NODES_DELETE: Final = "qshare.allocator.nodes.delete"
NODES_UPDATE: Final = "qshare.allocator.nodes.update"
GPUS_DELETE: Final = "qshare.allocator.gpus.delete"
GPUS_SHARING: Final = "qshare.allocator.gpus.sharing"
"""Ask for a card's sharing (or go back to its node agent's settings); see ChangeSharing."""
PLACEMENT_PREVIEW: Final = "qshare.allocator.placement.preview"
CLAIMS_MOVE: Final = "qshare.allocator.claims.move"
"""The preemptor asks the allocator to move a starved low-priority claim to a better card."""
NODE_USAGES: Final = "qshare.node.*.usage"
"""Wildcard the preemptor subscribes to; node agents publish on `usage(node)`."""
HEARTBEATS: Final = "qshare.node.*.heartbeat"
"""Wildcard the allocator subscribes to; nodes publish on `heartbeat(node)`."""

ALLOCATOR_QUEUE: Final = "qshare-allocator"
"""Queue group shared by allocator replicas: each request reaches exactly one replica."""

EVENTS_STREAM: Final = "QSHARE_EVENTS"
EVENTS_SUBJECTS: Final = ("qshare.evt.>",)
"""JetStream stream holding every `qshare.evt.…` event (claims, GPUs)."""


NODE_REGISTRATIONS: Final = "qshare.node.*.register"
"""A node agent registers on its own node's subject: its NATS identity may publish nothing
else, so it cannot register under another node's name (the allocator checks the name)."""


def node_token(node: str) -> str:
    """`node` as one subject token: each dot written `~` (`*` stays a wildcard)."""
    return node.replace(".", "~")


def node_from_token(token: str) -> str:
    """The node name a subject token stands for (the inverse of `node_token`)."""
    return token.replace("~", ".")


def node_register(node: str) -> str:
    return f"qshare.node.{node_token(node)}.register"


def node_of(subject: str) -> str:
    """The node name in `qshare.node.<node>.…` (register, heartbeat, usage, cmd)."""
    return node_from_token(subject.split(".")[2])


def heartbeat(node: str) -> str:
    return f"qshare.node.{node_token(node)}.heartbeat"


def usage(node: str) -> str:
    return f"qshare.node.{node_token(node)}.usage"


def node_command(node: str, verb: str) -> str:
    """`verb` is one of apply, release, suspend, resume, policy."""
    return f"qshare.node.{node_token(node)}.cmd.{verb}"


def claim_event(claim_id: str, kind: str) -> str:
    """`kind` is one of pending, placed, ready, releasing, released, failed, evicting, degraded,
    suspended, resumed, starved, moved, resized."""
    return f"qshare.evt.claim.{claim_id}.{kind}"


def gpu_event(node: str, gpu: str, kind: str) -> str:
    """`kind` is one of busy, idle, suspended, resumed, oom, attach, detach, client_died."""
    return f"qshare.evt.gpu.{node_token(node)}.{gpu}.{kind}"


def node_commands(node: str) -> str:
    """Wildcard a node agent subscribes to: every command for its node."""
    return f"qshare.node.{node_token(node)}.cmd.*"


def parse_gpu_event(subject: str) -> tuple[str, str, str]:
    """(node, gpu, kind) of `qshare.evt.gpu.<node>.<gpu>.<kind>`."""
    parts = subject.split(".")
    return node_from_token(parts[3]), parts[4], parts[5]


NODES_ANNOUNCE: Final = "qshare.nodes.announce"
"""Broadcast the preemptor publishes when it starts and whenever it reconnects to NATS: every
node agent answers by publishing its cards' present busy/idle state again (rate-limited), so
card events missed while the preemptor was away are made good (level-triggered resync)."""
