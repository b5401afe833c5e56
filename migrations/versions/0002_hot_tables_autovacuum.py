"""Vacuum the hot tables early: `nodes` and `gpus` change on every placement and `outbox`
is a queue. Dead versions of `nodes` rows leave dead entries at the top of `nodes_by_free`
that every `spread` scan walks, so they are vacuumed after a few hundred changes rather
than after 20 % of the table (the server's `autovacuum_naptime` bounds how soon).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

HOT_TABLES = {"nodes": 200, "gpus": 1000, "outbox": 1000}


def upgrade() -> None:
    for table, threshold in HOT_TABLES.items():
        op.execute(
            f"ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0, "
            f"autovacuum_vacuum_threshold = {threshold}, autovacuum_vacuum_cost_delay = 0)"
        )


def downgrade() -> None:
    for table in HOT_TABLES:
        op.execute(
            f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)"
        )
