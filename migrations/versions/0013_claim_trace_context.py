"""The trace context of the request that created a claim (`claims.trace_context`: its W3C
`traceparent` and, if any, `tracestate`; null when the request carried no trace): a placement
made later (the pending sweep, a re-placement, the end of an eviction) runs in that trace.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("claims", sa.Column("trace_context", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("claims", "trace_context")
