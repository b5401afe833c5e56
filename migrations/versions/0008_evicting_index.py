"""Claims being evicted: the partial index `claims_evicting` serves the dispatcher's
search for victims whose grace is over, every scan.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "claims_evicting",
        "claims",
        ["evict_at"],
        postgresql_where=sa.text("evict_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("claims_evicting", "claims")
