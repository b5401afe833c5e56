"""When the last heartbeat applied to a node was sent (`nodes.heartbeat_sent_at`, the node's
own clock; null until one is, and again after each registration): a heartbeat sent before
it, taken by another replica and committed later, no longer sets the cards' health back.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("heartbeat_sent_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("nodes", "heartbeat_sent_at")
