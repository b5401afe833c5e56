"""How an admin asked a card to be shared (`PATCH /v1/gpus/{uuid}/sharing`):
`gpus.sharing_requested` (null: the node agent's settings), sent to the node with its desired
state at `gpus.sharing_generation` (pending until the node confirms that generation), and
`gpus.sharing_refused`, the node's reason when it could not.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("sharing_requested", JSONB, nullable=True))
    op.add_column("gpus", sa.Column("sharing_refused", sa.Text, nullable=True))
    op.add_column("gpus", sa.Column("sharing_generation", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("gpus", "sharing_generation")
    op.drop_column("gpus", "sharing_refused")
    op.drop_column("gpus", "sharing_requested")
