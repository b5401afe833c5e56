"""Gang records name every busy card holding the gang: `preemptions.busy_gpus` (a gang
record's cards whose high priority holds the claim suspended; NULL for other kinds), from
which a restarted preemptor rebuilds its state. Open gang records take their one card.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("preemptions", sa.Column("busy_gpus", ARRAY(sa.Text), nullable=True))
    op.execute(
        "UPDATE preemptions SET busy_gpus = ARRAY[gpu_uuid] "
        "WHERE kind = 'gang' AND ended_at IS NULL AND gpu_uuid IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_column("preemptions", "busy_gpus")
