"""Release confirmation: a deleted claim on a node with an agent is `releasing` until the
node confirms a generation at or after `release_generation`, the one that dropped its vGPUs;
the allocator finds them by node through the partial index `claims_releasing`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("claims", sa.Column("release_generation", sa.BigInteger, nullable=True))
    op.create_index(
        "claims_releasing",
        "claims",
        ["node_name"],
        postgresql_where=sa.text("status = 'releasing'"),
    )


def downgrade() -> None:
    op.drop_index("claims_releasing", "claims")
    op.drop_column("claims", "release_generation")
