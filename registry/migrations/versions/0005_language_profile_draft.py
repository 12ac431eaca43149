"""Language profiles name the draft that covers the language best and its measured or predicted mean
acceptance length there, with every draft's fit in ``details``.

Existing profiles were written before drafts were compared, so they get no draft and empty details.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07 08:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('language_profiles', schema=None) as batch_op:
        batch_op.add_column(sa.Column('draft', sa.String(length=250), nullable=True))
        batch_op.add_column(sa.Column('acceptance', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('acceptance_basis', sa.String(length=30), nullable=True))
        batch_op.add_column(sa.Column('details', sa.JSON(), nullable=True))
    op.execute("UPDATE language_profiles SET details = '{}'")
    with op.batch_alter_table('language_profiles', schema=None) as batch_op:
        batch_op.alter_column('details', existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('language_profiles', schema=None) as batch_op:
        batch_op.drop_column('details')
        batch_op.drop_column('acceptance_basis')
        batch_op.drop_column('acceptance')
        batch_op.drop_column('draft')
