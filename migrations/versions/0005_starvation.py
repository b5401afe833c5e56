"""Starvation watch: classes say below which share of its card a low-priority claim is
starved (`starvation_share`, 0 = not watched) and whether it may then be moved to a card
with more harvestable time (`move_on_starvation`); `starvations` records each case.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "classes", sa.Column("starvation_share", sa.Float, nullable=False, server_default="0")
    )
    op.add_column(
        "classes",
        sa.Column("move_on_starvation", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_check_constraint(
        "classes_starvation_share", "classes", "starvation_share >= 0 AND starvation_share <= 1"
    )
    op.create_table(
        "starvations",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("claim_id", sa.Uuid, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("gpu_uuid", sa.Text, nullable=False),
        sa.Column("node_name", sa.Text, nullable=False),
        sa.Column("share", sa.Float, nullable=False),
        sa.Column("harvestable_share", sa.Float, nullable=False),
        sa.Column("window_s", sa.Float, nullable=False),
        sa.Column("moved_to", sa.Text, nullable=True),
        sa.Column("note", sa.Text, nullable=False, server_default=""),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "starvations_open",
        "starvations",
        ["claim_id"],
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index("starvations_by_time", "starvations", ["started_at", "id"])


def downgrade() -> None:
    op.drop_table("starvations")
    op.drop_constraint("classes_starvation_share", "classes")
    op.drop_column("classes", "move_on_starvation")
    op.drop_column("classes", "starvation_share")
