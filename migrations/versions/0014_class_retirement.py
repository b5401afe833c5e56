"""Class retirement: a class whose claims have all ended is retired on delete
(`classes.retired_at`, null while the class is in use) rather than deleted, since its ended
claims keep naming it; a retired class is not listed and no new claim may name it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("classes", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("classes", "retired_at")
