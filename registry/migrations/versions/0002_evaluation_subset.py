"""Evaluations say which answers they cover: subset ("all" | "non_degenerate") and the degenerate share.

Existing evaluations were measured over all answers, so they get subset 'all' and no degenerate share.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 22:30:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('subset', sa.String(length=20), server_default='all', nullable=False))
        batch_op.add_column(sa.Column('degenerate_share', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('degenerate_share')
        batch_op.drop_column('subset')
