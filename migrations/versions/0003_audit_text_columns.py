"""The audit log keeps its actor and target whole (TEXT columns).

``audit_log.actor`` and ``audit_log.target`` become TEXT (they were VARCHAR(128), and were cut to fit: ``tenant:`` plus a 128-character tenant
name, or a long JWT subject, was stored shortened, and a filter by the whole target found nothing).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.alter_column("actor", existing_type=sa.String(length=128), type_=sa.Text(), existing_nullable=False)
        batch_op.alter_column("target", existing_type=sa.String(length=128), type_=sa.Text(), existing_nullable=False)


def downgrade() -> None:
    # (longer values are cut back to 128 characters, as the code before this revision stored them)
    op.execute("UPDATE audit_log SET actor = substr(actor, 1, 128), target = substr(target, 1, 128)")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.alter_column("actor", existing_type=sa.Text(), type_=sa.String(length=128), existing_nullable=False)
        batch_op.alter_column("target", existing_type=sa.Text(), type_=sa.String(length=128), existing_nullable=False)
