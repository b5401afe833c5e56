"""Inventory (nodes, gpus), classes, claims, vgpus, outbox and tokens.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOW = sa.func.now()
EMPTY = sa.text("'{}'::jsonb")


def _ts(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=NOW)


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("labels", JSONB, nullable=False, server_default=EMPTY),
        sa.Column("schedulable", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        _ts("registered_at"),
        sa.Column("free_mib", sa.BigInteger, nullable=False, server_default="0"),
        sa.CheckConstraint("free_mib >= 0", name="nodes_free_not_negative"),
    )
    op.create_index("nodes_by_free", "nodes", ["free_mib", "name"])
    op.create_table(
        "gpus",
        sa.Column("uuid", sa.Text, primary_key=True),
        sa.Column("node_name", sa.Text, sa.ForeignKey("nodes.name", ondelete="CASCADE"), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("memory_mib", sa.Integer, nullable=False),
        sa.Column("max_vgpus", sa.Integer, nullable=False),
        sa.Column("healthy", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("allocated_mib", sa.Integer, nullable=False, server_default="0"),
        sa.Column("core_high", sa.Integer, nullable=False, server_default="0"),
        sa.Column("core_low", sa.Integer, nullable=False, server_default="0"),
        sa.Column("vgpu_count", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("node_name", "idx", name="gpus_node_index"),
        sa.CheckConstraint("allocated_mib BETWEEN 0 AND memory_mib", name="gpus_memory_not_oversubscribed"),
        sa.CheckConstraint("core_high BETWEEN 0 AND 100", name="gpus_high_core_within_card"),
        sa.CheckConstraint("core_low BETWEEN 0 AND 100", name="gpus_low_core_within_card"),
        sa.CheckConstraint("vgpu_count BETWEEN 0 AND max_vgpus", name="gpus_vgpus_within_limit"),
    )
    op.create_table(
        "classes",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("provisioner", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        _ts("created_at"),
        sa.CheckConstraint("provisioner IN ('qshare', 'whole')", name="classes_known_provisioner"),
    )
    op.bulk_insert(
        sa.table("classes", sa.column("name"), sa.column("provisioner"), sa.column("description")),
        [
            {"name": "qshare", "provisioner": "qshare", "description": "driver-level slices of a card"},
            {"name": "whole", "provisioner": "whole", "description": "whole cards, not shared"},
        ],
    )
    op.create_table(
        "claims",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("priority", sa.Text, nullable=False),
        sa.Column("vcore", sa.Integer, nullable=False),
        sa.Column("vmemory_mib", sa.Integer, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("class_name", sa.Text, sa.ForeignKey("classes.name"), nullable=False),
        sa.Column("node_selector", JSONB, nullable=False, server_default=EMPTY),
        sa.Column("placement", JSONB, nullable=True),
        sa.Column("idempotency_key", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("node_name", sa.Text, nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="claims_idempotency"),
    )
    op.create_index(
        "claims_pending", "claims", ["created_at"], postgresql_where=sa.text("status = 'pending'")
    )
    op.create_index("claims_by_tenant", "claims", ["tenant", "created_at", "id"])
    op.create_index("claims_by_time", "claims", ["created_at", "id"])
    op.create_table(
        "vgpus",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("claim_id", sa.Uuid, sa.ForeignKey("claims.id", ondelete="CASCADE"), nullable=False),
        sa.Column("gpu_uuid", sa.Text, sa.ForeignKey("gpus.uuid"), nullable=False),
        sa.Column("node_name", sa.Text, nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("priority", sa.Text, nullable=False),
        sa.Column("vcore", sa.Integer, nullable=False),
        sa.Column("vmemory_mib", sa.Integer, nullable=False),
        _ts("created_at"),
        sa.UniqueConstraint("claim_id", "gpu_uuid", name="vgpus_distinct_cards"),
    )
    op.create_index("vgpus_by_gpu", "vgpus", ["gpu_uuid"])
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("headers", JSONB, nullable=False, server_default=EMPTY),
        _ts("created_at"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("token_hash", sa.Text, nullable=False, unique=True),
        _ts("created_at"),
        sa.CheckConstraint("role IN ('admin', 'tenant')", name="tokens_known_role"),
    )


def downgrade() -> None:
    for table in ("tokens", "outbox", "vgpus", "claims", "classes", "gpus", "nodes"):
        op.drop_table(table)
