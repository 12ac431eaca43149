"""The same registry on a real PostgreSQL server: a throwaway cluster that this module starts itself
(the `pg_url` fixture, tests/postgres.py).

`make test` installs Debian's postgresql (`make postgres`), so a missing server is a failure here, never a
silent skip. Only `make test-fast` (POLYSPEC_SKIP_INTEGRATION=1) may leave it out, and only when the server
is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_registry_on_postgres(pg_url: str, verifier, base_draft_dir: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from polyspec.registry import open_registry
    from polyspec.registry.schema import Base

    reg = open_registry(pg_url)
    assert reg.engine.dialect.name == "postgresql"  # the URL really reached the server, not a fallback
    with reg.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    v = reg.add_verifier(verifier)
    base = reg.import_draft(base_draft_dir, verifier=v.name, name="en-base", languages=["en"], status="active")
    reg.add_evaluation(base.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.2, 0.1, 0.05])
    cand = reg.import_draft(base_draft_dir, verifier=v.name, name="fr-ft", languages=["fr"], parent=base.ref)
    reg.add_evaluation(cand.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.4, 0.2, 0.1])
    assert reg.promote(cand.ref).passed
    reg.deploy(cand.ref, name="fr-1", url="http://127.0.0.1:8001")
    reg.record_live_stats("r1", [{"language": "fr", "draft_name": cand.ref, "requests": 2, "accepted_per_pos": [1]}])
    reg.record_live_stats("r2", [{"language": "fr", "draft_name": cand.ref, "requests": 1, "accepted_per_pos": [1]}])
    assert [(s.requests, s.accepted_per_pos) for s in reg.live_stats()] == [(3, [2])]
    assert reg.active_deployments()[0].offline_mal == {"fr": pytest.approx(1.7)}
    it = reg.add_language("it", verifier=v.name, shipped=False)  # a profile naming its draft, with every fit
    assert (it.draft, it.acceptance_basis, it.plan) == (cand.ref, "predicted", "finetune")
    assert [f["draft"] for f in reg.get_language("it").fits] == [cand.ref, base.ref]
    data = reg.export_json()
    assert set(reg.import_json(data).values()) == {0}
    reg.close()
    again = open_registry(pg_url)  # reopening does not migrate again
    assert again.get_draft("fr-ft").status == "active"
    again.close()
