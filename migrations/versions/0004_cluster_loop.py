"""The cluster loop: what each node should run and has confirmed, driver ids of vGPUs,
gangs, evictions and preemption records.

- `nodes.segment`, `nodes.shm_dir`: where the node agent's driver segment lives, so a claim
  can say what a process needs to attach.
- `nodes.desired_generation` / `applied_generation`: bumped with every change of the
  node's vGPUs (under the node's row lock); the node agent confirms a generation.
- `nodes.core_high`, `nodes.core_low`: the sums of the node's cards' core shares per priority,
  kept with `free_mib`, so placement can judge each priority against its own kind per node
  without reading every card.
- `vgpus.local_id`: the vGPU's id in the node's driver segment (below 2^31; the node agent
  keeps the upper half for vGPUs prepared locally, e.g. by Kubernetes DRA).
- `claims.gang`, `claims.evict_at`: gang name for suspension across cards and nodes; the
  end of an eviction's grace period.
- `classes.evictable`, `classes.replace_on_failure`, `classes.eviction_grace_s`.
- `preemptions`: one row per suspension (gang, operator, memory eviction), open while it lasts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("segment", sa.Text, nullable=True))
    op.add_column("nodes", sa.Column("shm_dir", sa.Text, nullable=True))
    op.add_column(
        "nodes", sa.Column("desired_generation", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column(
        "nodes", sa.Column("applied_generation", sa.BigInteger, nullable=False, server_default="-1")
    )
    op.add_column(
        "nodes", sa.Column("core_high", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column("nodes", sa.Column("core_low", sa.BigInteger, nullable=False, server_default="0"))
    op.execute(
        "UPDATE nodes SET core_high = s.h, core_low = s.l FROM (SELECT node_name, sum(core_high) h,"
        " sum(core_low) l FROM gpus GROUP BY node_name) s WHERE s.node_name = nodes.name"
    )
    # spread (the default) walks these in order and stops at the first node that fits
    op.execute(
        "CREATE INDEX nodes_spread_high ON nodes (core_high, core_low DESC, free_mib DESC, name DESC)"
    )
    op.execute(
        "CREATE INDEX nodes_spread_low ON nodes (core_low, core_high DESC, free_mib DESC, name DESC)"
    )
    op.execute("CREATE SEQUENCE vgpu_local_ids AS integer START 1 MAXVALUE 2147483646 CYCLE")
    op.add_column(
        "vgpus",
        sa.Column(
            "local_id",
            sa.Integer,
            nullable=False,
            server_default=sa.text("nextval('vgpu_local_ids')"),
        ),
    )
    op.create_index("vgpus_by_node", "vgpus", ["node_name"])
    op.add_column("claims", sa.Column("gang", sa.Text, nullable=True))
    op.add_column("claims", sa.Column("evict_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "claims_by_gang", "claims", ["gang"], postgresql_where=sa.text("gang IS NOT NULL")
    )
    op.add_column(
        "classes", sa.Column("evictable", sa.Boolean, nullable=False, server_default=sa.true())
    )
    op.add_column(
        "classes",
        sa.Column("replace_on_failure", sa.Boolean, nullable=False, server_default=sa.true()),
    )
    op.add_column(
        "classes", sa.Column("eviction_grace_s", sa.Float, nullable=False, server_default="30")
    )
    op.create_table(
        "preemptions",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("claim_id", sa.Uuid, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("gpu_uuid", sa.Text, nullable=True),
        sa.Column("node_name", sa.Text, nullable=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('gang', 'operator', 'eviction')", name="preemptions_known_kind"
        ),
    )
    op.create_index(
        "preemptions_open",
        "preemptions",
        ["claim_id"],
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index("preemptions_by_time", "preemptions", ["started_at", "id"])


def downgrade() -> None:
    op.drop_table("preemptions")
    op.drop_index("nodes_spread_low", "nodes")
    op.drop_index("nodes_spread_high", "nodes")
    for column in ("eviction_grace_s", "replace_on_failure", "evictable"):
        op.drop_column("classes", column)
    op.drop_index("claims_by_gang", "claims")
    op.drop_column("claims", "evict_at")
    op.drop_column("claims", "gang")
    op.drop_index("vgpus_by_node", "vgpus")
    op.drop_column("vgpus", "local_id")
    op.execute("DROP SEQUENCE vgpu_local_ids")
    for column in (
        "core_low",
        "core_high",
        "applied_generation",
        "desired_generation",
        "shm_dir",
        "segment",
    ):
        op.drop_column("nodes", column)
