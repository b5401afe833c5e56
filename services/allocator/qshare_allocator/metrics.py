"""Prometheus metrics of the allocator."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

HANDLED = Counter("qshare_allocator_messages_total", "Messages handled", ["subject", "outcome"])
REJECTED = Counter(
    "qshare_allocator_rejected_messages_total",
    "Malformed messages (not an envelope, or a payload that fails validation) answered with an "
    "error; requests refused for their content count in messages_total as outcome invalid",
    ["subject"],
)
LATENCY = Histogram(
    "qshare_allocator_handle_seconds",
    "Time to handle one message, commit included",
    ["subject"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
CLAIMS = Counter(
    "qshare_allocator_claims_total", "Claims created, by outcome", ["priority", "status"]
)
PENDING_PLACED = Counter("qshare_allocator_pending_placed_total", "Pending claims placed later")
OUTBOX_DEAD = Counter(
    "qshare_allocator_outbox_dead_total",
    "Events that could not be published and were set aside in outbox_dead",
)
GROUP_SIZE = Histogram(
    "qshare_allocator_group_commit_size",
    "Requests that shared one transaction (group commit), by handler",
    ["handler"],
    buckets=(1, 2, 4, 8, 16, 32),
)
