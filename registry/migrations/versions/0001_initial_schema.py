"""Initial registry schema: verifiers, drafts, evaluations, deployments, language profiles, live stats, events.

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 07:26:07.139394

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('subject', sa.String(length=250), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('live_stats',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('router_id', sa.String(length=100), nullable=False),
    sa.Column('language', sa.String(length=10), nullable=False),
    sa.Column('domain', sa.String(length=50), nullable=False),
    sa.Column('draft_name', sa.String(length=200), nullable=False),
    sa.Column('requests', sa.Integer(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=False),
    sa.Column('num_spec_steps', sa.Integer(), nullable=False),
    sa.Column('num_draft_tokens', sa.Integer(), nullable=False),
    sa.Column('num_accepted_tokens', sa.Integer(), nullable=False),
    sa.Column('accepted_per_pos', sa.JSON(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('router_id', 'language', 'domain', 'draft_name')
    )
    op.create_table('verifiers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('location', sa.Text(), nullable=False),
    sa.Column('architecture', sa.String(length=100), nullable=False),
    sa.Column('vocab_size', sa.Integer(), nullable=False),
    sa.Column('hidden_size', sa.Integer(), nullable=False),
    sa.Column('num_layers', sa.Integer(), nullable=False),
    sa.Column('checksums', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('drafts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('location', sa.Text(), nullable=False),
    sa.Column('checksums', sa.JSON(), nullable=False),
    sa.Column('verifier_id', sa.Integer(), nullable=False),
    sa.Column('languages', sa.JSON(), nullable=False),
    sa.Column('domain', sa.String(length=50), nullable=False),
    sa.Column('draft_vocab_size', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=True),
    sa.Column('provenance', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['parent_id'], ['drafts.id'], ),
    sa.ForeignKeyConstraint(['verifier_id'], ['verifiers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', 'version')
    )
    op.create_table('language_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('code', sa.String(length=10), nullable=False),
    sa.Column('verifier_id', sa.Integer(), nullable=True),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('script', sa.String(length=50), nullable=False),
    sa.Column('is_latin', sa.Integer(), nullable=False),
    sa.Column('coverage', sa.JSON(), nullable=False),
    sa.Column('plan', sa.String(length=40), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('prompts_file', sa.Text(), nullable=True),
    sa.Column('num_prompts', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['verifier_id'], ['verifiers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('code', 'verifier_id')
    )
    op.create_table('deployments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('draft_id', sa.Integer(), nullable=True),
    sa.Column('verifier_id', sa.Integer(), nullable=True),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('url', sa.Text(), nullable=True),
    sa.Column('launch', sa.JSON(), nullable=False),
    sa.Column('languages', sa.JSON(), nullable=False),
    sa.Column('domain', sa.String(length=50), nullable=False),
    sa.Column('is_default', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['draft_id'], ['drafts.id'], ),
    sa.ForeignKeyConstraint(['verifier_id'], ['verifiers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('draft_id', sa.Integer(), nullable=False),
    sa.Column('benchmark', sa.String(length=100), nullable=False),
    sa.Column('language', sa.String(length=10), nullable=False),
    sa.Column('domain', sa.String(length=50), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('acceptance', sa.JSON(), nullable=False),
    sa.Column('mean_acceptance_length', sa.Float(), nullable=False),
    sa.Column('num_prompts', sa.Integer(), nullable=False),
    sa.Column('num_tokens', sa.Integer(), nullable=False),
    sa.Column('method', sa.String(length=20), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['draft_id'], ['drafts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('evaluations')
    op.drop_table('deployments')
    op.drop_table('language_profiles')
    op.drop_table('drafts')
    op.drop_table('verifiers')
    op.drop_table('live_stats')
    op.drop_table('events')
