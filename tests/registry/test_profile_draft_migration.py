"""Migration 0005: profiles written before drafts were compared keep their plan, with no draft and no figures;
exports without the new fields import as such."""

from __future__ import annotations

from pathlib import Path

from tests.registry.conftest import write_at_revision


def test_existing_profiles_get_no_draft(tmp_path: Path, verifier) -> None:
    from polyspec.registry import open_registry

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with open_registry(url) as reg:
        reg.add_verifier(verifier)
    write_at_revision(url, "0004", (
        "INSERT INTO language_profiles (code, verifier_id, name, script, is_latin, coverage, plan, reason,"
        " prompts_file, num_prompts, updated_at) VALUES ('fr', 1, 'French', 'Latin', 1, '{\"en-top8192\": 0.7}',"
        " 'finetune', 'old', NULL, 3, '2026-01-01 00:00:00')"))
    with open_registry(url) as reg:  # opening upgrades to head
        [fr] = reg.languages()
        assert (fr.plan, fr.coverage, fr.coverage_reference) == ("finetune", 0.7, "en-top8192")
        assert (fr.draft, fr.acceptance, fr.acceptance_basis, fr.fits, fr.text) == (None, None, None, [], None)
        export = reg.export_json()
    assert export["language_profiles"][0]["details"] == {}
    later = ("draft", "acceptance", "acceptance_basis", "details")
    old_style = {**export, "language_profiles": [{k: v for k, v in p.items() if k not in later}
                                                 for p in export["language_profiles"]]}
    with open_registry(f"sqlite:///{tmp_path / 'new.db'}") as fresh:
        assert fresh.import_json(old_style)["language_profiles"] == 1
        assert fresh.languages()[0].draft is None
