"""Who suspended and who resumed a claim: an operator record names the token that opened it
(`preemptions.suspended_by`) and the one that closed it (`resumed_by`), each as the token's
name and id; null on gang and eviction records, which the control plane opens itself.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("preemptions", sa.Column("suspended_by", sa.Text(), nullable=True))
    op.add_column("preemptions", sa.Column("resumed_by", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("preemptions", "resumed_by")
    op.drop_column("preemptions", "suspended_by")
