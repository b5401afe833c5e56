"""Evictions name the claim they make room for: `preemptions.for_claim` (the high-priority
claim an `eviction` record's victim leaves for), indexed while open. It was only in the
record's reason text; open records are filled from it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

FROM_REASON = """
UPDATE preemptions
   SET for_claim = substring(reason FROM 'evicted for high-priority claim ([0-9a-f-]{36})$')::uuid
 WHERE kind = 'eviction' AND ended_at IS NULL
   AND reason ~ 'evicted for high-priority claim [0-9a-f-]{36}$'
"""


def upgrade() -> None:
    op.add_column("preemptions", sa.Column("for_claim", sa.Uuid, nullable=True))
    op.execute(FROM_REASON)
    op.create_index(
        "preemptions_open_for_claim",
        "preemptions",
        ["for_claim"],
        postgresql_where=sa.text("ended_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("preemptions_open_for_claim", "preemptions")
    op.drop_column("preemptions", "for_claim")
