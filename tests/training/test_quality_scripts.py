"""scripts/quality_lib.py and scripts/quality_data.py: answering a pool under a budget, a draft's round trip."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import quality_data  # noqa: E402
import quality_lib  # noqa: E402


def test_a_short_budget_still_gives_every_decoding_the_same_prompts(verifier) -> None:
    from polyspec.models.hidden import load_verifier_model
    from polyspec.training.decoding import GREEDY, Decoding

    model, tok = load_verifier_model(verifier.path, device="cpu")
    pool = [{"id": f"p{i}", "prompt": text, "source": "a/b@1:f", "license": "MIT", "weight": 1.0}
            for i, text in enumerate(["Say hi.", "Name a fruit.", "Count to three."])]
    sampled = Decoding("sampled", temperature=0.7, samples=2)
    rows, stats = quality_lib.answer_pool(model, tok, pool, [GREEDY, sampled], budget_s=0.0, max_new_tokens=4,
                                          max_prompt_tokens=512, chunk_rows=4)
    greedy = {r["id"] for r in rows if r["decoding"] == "greedy"}
    assert len(greedy) == 2 and greedy == {r["id"] for r in rows if r["decoding"] == "sampled"}  # one batch, both
    assert stats["decodings"]["sampled"]["answers"] == 4 and stats["decodings"]["greedy"]["answers"] == 2
    assert all(r["license"] == "MIT" and isinstance(r["degenerate"], bool) for r in rows)


def test_an_exported_draft_comes_back_byte_identical(verifier, base_draft_dir: Path, tmp_path: Path) -> None:
    manifest = quality_lib.export_draft(base_draft_dir, tmp_path / "transport", "en")
    sent = tmp_path / "transport" / "en" / "weights.safetensors"
    assert sent.stat().st_size < (base_draft_dir / "model.safetensors").stat().st_size / 1.5  # lm_head stays home
    assert manifest["stripped"] == ["lm_head.weight"] and (tmp_path / "transport" / "en.done").is_file()
    quality_data.cmd_restore(tmp_path / "transport", tmp_path / "back", str(verifier.path))
    report = json.loads((tmp_path / "back" / "restore.json").read_text())["en"]
    assert report["tensors_differing"] == [] and report["byte_identical"]
    assert report["sha256"] == quality_lib.file_sha256(base_draft_dir / "model.safetensors")
