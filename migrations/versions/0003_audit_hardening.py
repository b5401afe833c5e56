"""Hardening after the control-plane audit (issue 11):

- `gpus.retired`: a card its node stopped reporting, kept apart from `healthy` (what the
  heartbeats say) so a heartbeat never brings a retired card back;
- `outbox_dead`: events the relay could not publish (too large, refused), set aside with
  the error instead of blocking every later event;
- `tokens.expires_at` and `tokens.scope` (`write` or `read`);
- `bootstraps`: a bootstrap token is stored once; revoking it never brings it back;
- `quotas`: per-tenant limits on memory, cards and pending claims.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "gpus", sa.Column("retired", sa.Boolean, nullable=False, server_default=sa.text("false"))
    )
    op.create_table(
        "outbox_dead",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("headers", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )  # fmt: skip
    op.add_column("tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tokens", sa.Column("scope", sa.Text, nullable=False, server_default=sa.text("'write'"))
    )
    op.create_check_constraint("tokens_known_scope", "tokens", "scope IN ('read', 'write')")
    op.create_table(
        "bootstraps",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("token_hash", sa.Text, nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )  # fmt: skip
    op.create_table(
        "quotas",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("memory_mib", sa.BigInteger, nullable=True),
        sa.Column("cards", sa.Integer, nullable=True),
        sa.Column("pending", sa.Integer, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_table("quotas")
    op.drop_table("bootstraps")
    op.drop_constraint("tokens_known_scope", "tokens")
    op.drop_column("tokens", "scope")
    op.drop_column("tokens", "expires_at")
    op.drop_table("outbox_dead")
    op.drop_column("gpus", "retired")
