"""The control-plane Postgres schema (as migrated by `migrations/`), shared by the allocator,
its only writer of inventory and placements, and the api, which reads it and manages tokens
and classes. Change it only together with a new Alembic revision.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

metadata = MetaData()


nodes = Table(
    "nodes",
    metadata,
    Column("name", Text, primary_key=True),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("schedulable", Boolean, nullable=False, server_default=text("true")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("heartbeat_sent_at", DateTime(timezone=True), nullable=True),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("free_mib", BigInteger, nullable=False, server_default=text("0")),
    Column("segment", Text, nullable=True),
    Column("shm_dir", Text, nullable=True),
    Column("desired_generation", BigInteger, nullable=False, server_default=text("0")),
    Column("applied_generation", BigInteger, nullable=False, server_default=text("-1")),
    Column("core_high", BigInteger, nullable=False, server_default=text("0")),
    Column("core_low", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("free_mib >= 0", name="nodes_free_not_negative"),
    Index("nodes_by_free", "free_mib", "name"),
    Index(
        "nodes_spread_high",
        "core_high",
        text("core_low DESC"),
        text("free_mib DESC"),
        text("name DESC"),
    ),
    Index(
        "nodes_spread_low",
        "core_low",
        text("core_high DESC"),
        text("free_mib DESC"),
        text("name DESC"),
    ),
)
"""`free_mib` sums its cards' free memory; placement orders nodes by it (spread/binpack).
`desired_generation` grows with every change of the node's vGPUs; the node agent confirms
what it applied as `applied_generation` (-1: nothing confirmed since it registered)."""

gpus = Table(
    "gpus",
    metadata,
    Column("uuid", Text, primary_key=True),
    Column("node_name", Text, ForeignKey("nodes.name", ondelete="CASCADE"), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("model", Text, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("max_vgpus", Integer, nullable=False),
    Column("healthy", Boolean, nullable=False, server_default=text("true")),
    Column("retired", Boolean, nullable=False, server_default=text("false")),
    Column("allocated_mib", Integer, nullable=False, server_default=text("0")),
    Column("core_high", Integer, nullable=False, server_default=text("0")),
    Column("core_low", Integer, nullable=False, server_default=text("0")),
    Column("vgpu_count", Integer, nullable=False, server_default=text("0")),
    Column("sharing", JSONB, nullable=True),  # CardSharing less `gpu`, from heartbeats
    Column("sharing_requested", JSONB, nullable=True),  # SharingSettings an admin asked for
    Column("sharing_refused", Text, nullable=True),  # why the node could not, when it could not
    Column("sharing_generation", BigInteger, nullable=True),  # the node's generation that asked
    UniqueConstraint("node_name", "idx", name="gpus_node_index"),
    CheckConstraint(
        "allocated_mib BETWEEN 0 AND memory_mib", name="gpus_memory_not_oversubscribed"
    ),
    CheckConstraint("core_high BETWEEN 0 AND 100", name="gpus_high_core_within_card"),
    CheckConstraint("core_low BETWEEN 0 AND 100", name="gpus_low_core_within_card"),
    CheckConstraint("vgpu_count BETWEEN 0 AND max_vgpus", name="gpus_vgpus_within_limit"),
)
"""Allocation counters are changed only under the owning node's row lock; the checks are a
last line of defence that makes Postgres itself refuse an oversubscribed card."""

classes = Table(
    "classes",
    metadata,
    Column("name", Text, primary_key=True),
    Column("provisioner", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=text("''")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("evictable", Boolean, nullable=False, server_default=text("true")),
    Column("replace_on_failure", Boolean, nullable=False, server_default=text("true")),
    Column("eviction_grace_s", Float, nullable=False, server_default=text("30")),
    Column("starvation_share", Float, nullable=False, server_default=text("0")),
    Column("move_on_starvation", Boolean, nullable=False, server_default=text("false")),
    Column("retired_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("provisioner IN ('qshare', 'whole')", name="classes_known_provisioner"),
    CheckConstraint(
        "starvation_share >= 0 AND starvation_share <= 1", name="classes_starvation_share"
    ),
)

claims = Table(
    "claims",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("priority", Text, nullable=False),
    Column("vcore", Integer, nullable=False),
    Column("vmemory_mib", Integer, nullable=False),
    Column("count", Integer, nullable=False),
    Column("class_name", Text, ForeignKey("classes.name"), nullable=False),
    Column("node_selector", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("placement", JSONB, nullable=True),
    Column("idempotency_key", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("node_name", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("gang", Text, nullable=True),
    Column("evict_at", DateTime(timezone=True), nullable=True),
    Column("release_generation", BigInteger, nullable=True),
    Column("trace_context", JSONB, nullable=True),  # the creating request's W3C trace context
    UniqueConstraint("tenant", "idempotency_key", name="claims_idempotency"),
    Index("claims_pending", "created_at", postgresql_where=text("status = 'pending'")),
    Index("claims_releasing", "node_name", postgresql_where=text("status = 'releasing'")),
    Index("claims_evicting", "evict_at", postgresql_where=text("evict_at IS NOT NULL")),
    Index("claims_by_gang", "gang", postgresql_where=text("gang IS NOT NULL")),
    Index("claims_by_tenant", "tenant", "created_at", "id"),
    Index("claims_by_time", "created_at", "id"),
)

vgpus = Table(
    "vgpus",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("claim_id", Uuid, ForeignKey("claims.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_uuid", Text, ForeignKey("gpus.uuid"), nullable=False),
    Column("node_name", Text, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("priority", Text, nullable=False),
    Column("vcore", Integer, nullable=False),
    Column("vmemory_mib", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("local_id", Integer, nullable=False, server_default=text("nextval('vgpu_local_ids')")),
    UniqueConstraint("claim_id", "gpu_uuid", name="vgpus_distinct_cards"),
    Index("vgpus_by_gpu", "gpu_uuid"),
    Index("vgpus_by_node", "node_name"),
)
"""`local_id` is the vGPU's id in its node's driver segment (from a sequence below 2^31)."""

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("subject", Text, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""Events written in the transaction that caused them; a relay publishes them after commit."""

preemptions = Table(
    "preemptions",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("claim_id", Uuid, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("gpu_uuid", Text, nullable=True),
    Column("node_name", Text, nullable=True),
    Column("kind", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("for_claim", Uuid, nullable=True),
    Column("busy_gpus", ARRAY(Text), nullable=True),
    Column("suspended_by", Text, nullable=True),
    Column("resumed_by", Text, nullable=True),
    CheckConstraint("kind IN ('gang', 'operator', 'eviction')", name="preemptions_known_kind"),
    Index("preemptions_open", "claim_id", postgresql_where=text("ended_at IS NULL")),
    Index("preemptions_open_for_claim", "for_claim", postgresql_where=text("ended_at IS NULL")),
    Index("preemptions_by_time", "started_at", "id"),
)
"""Suspensions the control plane made (gang, operator) and memory evictions; open while
`ended_at` is NULL. The driver's own per-card preemptions are counted by the node agent.
`gpu_uuid` is the card whose busy episode opened a gang record; `busy_gpus` every card whose
high priority holds the claim suspended (a card joins when it goes busy, leaves when it goes
idle; the record closes with the last, which it keeps); NULL for other kinds.
`suspended_by` and `resumed_by` name the tokens that opened and closed an operator record
("<token name> (token <id>)"); NULL on the records the control plane opens itself, and on
operator records from before migration 0015."""

starvations = Table(
    "starvations",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("claim_id", Uuid, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("node_name", Text, nullable=False),
    Column("share", Float, nullable=False),
    Column("harvestable_share", Float, nullable=False),
    Column("window_s", Float, nullable=False),
    Column("moved_to", Text, nullable=True),
    Column("note", Text, nullable=False, server_default=text("''")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Index("starvations_open", "claim_id", postgresql_where=text("ended_at IS NULL")),
    Index("starvations_by_time", "started_at", "id"),
)
"""Low-priority claims the preemptor found starved on a card (open while it lasts), with the
shares that decided it and, if it was moved, the card it went to."""

outbox_dead = Table(
    "outbox_dead",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("subject", Text, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("error", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("failed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""Outbox rows the relay could not publish (too large, refused): set aside, never retried."""

tokens = Table(
    "tokens",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("scope", Text, nullable=False, server_default=text("'write'")),
    CheckConstraint("role IN ('admin', 'tenant')", name="tokens_known_role"),
    CheckConstraint("scope IN ('read', 'write')", name="tokens_known_scope"),
)
"""Bearer tokens, stored as SHA-256 hex of the secret (secrets are 256 random bits)."""

bootstraps = Table(
    "bootstraps",
    metadata,
    Column("name", Text, primary_key=True),
    Column("token_hash", Text, nullable=False),
    Column("done_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""Bootstrap tokens stored once: a revoked bootstrap token is never stored again."""

quotas = Table(
    "quotas",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("memory_mib", BigInteger, nullable=True),
    Column("cards", Integer, nullable=True),
    Column("pending", Integer, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""Per-tenant limits (None: unlimited) on held memory, held cards and pending claims."""
