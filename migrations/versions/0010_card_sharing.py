"""How each card is shared, as its node agent reports it with each heartbeat: `gpus.sharing`
(policy, release mode and delay in force, LP window, device gate; null until reported).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("sharing", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("gpus", "sharing")
