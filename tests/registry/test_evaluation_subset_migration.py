"""Migration 0002: evaluations recorded before it cover all answers; exports without the fields import as such."""

from __future__ import annotations

from pathlib import Path

from tests.registry.conftest import write_at_revision


def test_existing_evaluations_become_subset_all(tmp_path: Path, base_draft_dir: Path, verifier) -> None:
    from polyspec.registry import open_registry

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with open_registry(url) as reg:  # build at head, go back to 0001 and write a row the old way
        reg.add_verifier(verifier)
        reg.import_draft(base_draft_dir, verifier=verifier.name, name="en-base", languages=["en"])
    write_at_revision(url, "0001", (
        "INSERT INTO evaluations (draft_id, benchmark, language, domain, k, acceptance, mean_acceptance_length,"
        " num_prompts, num_tokens, method, details, created_at) VALUES (1, 'mtbench', 'en', 'general', 1,"
        " '[0.5]', 1.5, 10, 100, 'offline', '{}', '2026-01-01 00:00:00')"))
    with open_registry(url) as reg:  # opening upgrades to head
        [ev] = reg.evaluations()
        assert (ev.subset, ev.degenerate_share, ev.mean_acceptance_length) == ("all", None, 1.5)
        export = reg.export_json()
    assert export["evaluations"][0]["subset"] == "all"
    old_style = {**export, "evaluations": [{k: v for k, v in e.items() if k not in ("subset", "degenerate_share")}
                                           for e in export["evaluations"]]}
    with open_registry(f"sqlite:///{tmp_path / 'new.db'}") as fresh:
        assert fresh.import_json(old_style)["evaluations"] == 1
        assert fresh.evaluations()[0].subset == "all"
