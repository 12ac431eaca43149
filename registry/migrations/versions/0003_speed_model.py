"""The speed model's inputs: engine calibrations (step cost per batch size) and live generation time;
recommendations (`polyspec deploy plan`: train a draft for a language, serve it without speculation, change k).

Existing live rows get generation_s 0: they have no time, so observed tokens/s starts with new traffic.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 05:00:00
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('engine_calibrations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('deployment', sa.String(length=200), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('draft_name', sa.String(length=200), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('step_s', sa.Float(), nullable=False),
    sa.Column('tokens_per_s', sa.Float(), nullable=False),
    sa.Column('requests', sa.Integer(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('engine_calibrations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_engine_calibrations_deployment'), ['deployment'], unique=False)
    with op.batch_alter_table('live_stats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('generation_s', sa.Float(), server_default='0', nullable=False))
    op.create_table('recommendations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('subject', sa.String(length=250), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )


def downgrade() -> None:
    op.drop_table('recommendations')
    with op.batch_alter_table('live_stats', schema=None) as batch_op:
        batch_op.drop_column('generation_s')
    with op.batch_alter_table('engine_calibrations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_engine_calibrations_deployment'))
    op.drop_table('engine_calibrations')
