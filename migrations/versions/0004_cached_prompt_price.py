"""A price for prompt tokens served from the prefix cache (model_prices.cached_prompt_usd_per_1m).

Null (every existing row) bills them as other prompt tokens, as before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_prices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cached_prompt_usd_per_1m", sa.Numeric(18, 8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_prices", schema=None) as batch_op:
        batch_op.drop_column("cached_prompt_usd_per_1m")
