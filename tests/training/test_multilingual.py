"""One draft for several languages: the mixture flags, the per-language prompts split, the grown vocabulary of a
warm start, and hostile input through the CLI (each refused with a clear error naming the input, no run left)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from polyspec.training.config import RunConfig
from polyspec.training.multilingual import MixError, _quotas, parse_mix
from tests.cli import polyspec
from tests.training.conftest import pack_rows, write_jsonl


def test_parse_mix_resolves_equal_explicit_and_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    from polyspec.training import multilingual

    equal = parse_mix("en,FRA,de", None, None)
    assert equal["languages"] == ["en", "fr", "de"] and equal["source"] == "equal"
    assert equal["weights"] == pytest.approx({"en": 1 / 3, "fr": 1 / 3, "de": 1 / 3})
    explicit = parse_mix(None, "en=0.5,fr=0.25,ja=0.25", 0.9)
    assert explicit["languages"] == ["en", "fr", "ja"] and explicit["coverage_target"] == 0.9
    monkeypatch.setattr(multilingual, "live_requests", lambda langs: {"en": 30, "fr": 10, "de": 0})
    traffic = parse_mix("en,fr,de", "traffic", None)
    assert traffic["weights"] == {"en": 0.75, "fr": 0.25, "de": 0.0}
    assert traffic["traffic_requests"] == {"en": 30, "fr": 10, "de": 0}
    assert parse_mix(None, None, None) is None
    config = RunConfig(run_id="m", language="mul", mix=explicit)
    assert config.languages == ["en", "fr", "ja"]


@pytest.mark.parametrize(("languages", "mix", "target", "message"), [
    ("en,xx", None, None, "unknown language code 'xx'"),
    ("en", None, None, "at least two languages"),
    ("en,fr", "en=0.6,fr=0.6", None, "must sum to 1"),
    ("en,fr", "en=-0.5,fr=1.5", None, "must not be negative"),
    ("en,fr", "en=0.5,de=0.5", None, "not in --languages: ['de']"),
    ("en,fr", "en:0.5", None, "expected equal, traffic or LANG=WEIGHT"),
    ("en,fr", None, 1.5, "--coverage-target must lie in (0, 1]"),
])
def test_parse_mix_refuses(languages: str, mix: str | None, target: float | None, message: str) -> None:
    with pytest.raises(MixError) as exc:
        parse_mix(languages, mix, target)
    assert message in exc.value.message


def test_traffic_mix_without_traffic_is_refused(registry_url: str) -> None:
    with pytest.raises(MixError, match="no live requests for en, fr"):
        parse_mix("en,fr", "traffic", None)


def test_quotas_follow_the_weights_within_what_each_language_has() -> None:
    assert _quotas({"en": 100, "fr": 100}, {"en": 0.75, "fr": 0.25}, 40) == {"en": 30, "fr": 10}
    assert _quotas({"en": 100, "fr": 5}, {"en": 0.5, "fr": 0.5}, 40) == {"en": 20, "fr": 5}
    assert _quotas({"en": 10, "fr": 10}, {"en": 0.5, "fr": 0.5}, None) == {"en": 10, "fr": 10}


def test_prompts_hold_out_a_split_of_every_language(shared_data: Path, tmp_path: Path) -> None:
    from polyspec.training.multilingual import build_mix_prompts
    from polyspec.training.prompts import read_jsonl

    files = [write_jsonl(tmp_path / f"{lang}.jsonl", pack_rows(shared_data, lang, "general", 20)) for lang in ("en", "fr")]
    cfg = RunConfig(run_id="m", language="mul", mode="from-scratch-custom-vocab", prompts={"files": files, "max_prompts": 12},
                    mix=parse_mix(None, "en=0.75,fr=0.25", None))
    stats = build_mix_prompts(tmp_path, cfg)
    held = read_jsonl(tmp_path / "heldout.jsonl")
    train = read_jsonl(tmp_path / "train.jsonl")
    assert {r["lang"] for r in held} == {"en", "fr"} and stats["heldout"] == len(held) == 4
    assert stats["languages"]["en"]["train"] == 9 and stats["languages"]["fr"]["train"] == 3
    assert not {r["id"] for r in held} & {r["id"] for r in train}
    assert stats["languages"]["fr"]["files"] == {"fr.jsonl": 20}
    assert all(len(v["sha256"]) == 64 for v in stats["files"].values())


def test_warm_start_grows_the_parent_vocabulary_from_the_verifier(verifier, base_draft_dir: Path, tmp_path: Path) -> None:
    import torch

    from polyspec.models.draft_build import load_draft, verifier_lm_head_weight
    from polyspec.models.drafts import draft_token_ids
    from polyspec.training.multilingual import _init_mix_draft

    parent_ids = draft_token_ids(base_draft_dir)
    extra = [t for t in range(verifier.vocab_size - 1, 0, -1) if t not in set(parent_ids)][:64]
    ids = sorted(parent_ids + extra)
    cfg = RunConfig(run_id="m", language="mul", mode="finetune", parent_draft=str(base_draft_dir),
                    mix=parse_mix("en,fr", None, None))
    _init_mix_draft(tmp_path / "grown", cfg, verifier, base_draft_dir, ids, [2, 15, 27])
    grown, parent = load_draft(tmp_path / "grown", verifier.path), load_draft(base_draft_dir, verifier.path)
    assert draft_token_ids(tmp_path / "grown") == ids
    rows = verifier_lm_head_weight(verifier.path)[torch.tensor(ids)]
    assert torch.allclose(grown.lm_head.weight, rows.to(grown.lm_head.weight.dtype), atol=1e-2)
    kept = [k for k in parent.state_dict() if k.startswith(("layers.", "fc."))]
    assert kept and all(torch.equal(grown.state_dict()[k], parent.state_dict()[k]) for k in kept)


# ---- hostile input through the CLI ---------------------------------------------------------------------------

def _cli(*args: str, home: Path, **settings: str) -> subprocess.CompletedProcess:
    return polyspec("train", "run", *args, home=home, **settings)


def _refused(result: subprocess.CompletedProcess, message: str, home: Path) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    runs = home / "runs"
    assert not runs.is_dir() or not any(runs.iterdir()), "a refused run must leave nothing behind"


def test_cli_refuses_bad_mixtures_before_making_a_run(tmp_path: Path, verifier, registry_url: str) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "1", "prompt": "Hello there, how are you today?"}])
    common = ("--prompts", str(prompts), "--verifier", str(verifier.path), "--run-id", "bad")
    _refused(_cli("--languages", "en,xx", *common, home=tmp_path), "unknown language code 'xx'", tmp_path)
    _refused(_cli("--mix", "en=0.7,fr=0.7", *common, home=tmp_path), "must sum to 1, they sum to 1.4", tmp_path)
    _refused(_cli("--mix", "en=-0.2,fr=1.2", *common, home=tmp_path), "must not be negative: {'en': -0.2}", tmp_path)


def test_cli_refuses_a_language_without_prompts_and_a_foreign_parent(tmp_path: Path, shared_data: Path, verifier,
                                                                     base_draft_dir: Path, registry_url: str) -> None:
    import shutil

    en = write_jsonl(tmp_path / "en.jsonl", pack_rows(shared_data, "en", "general", 6))
    fr = write_jsonl(tmp_path / "fr.jsonl", pack_rows(shared_data, "fr", "general", 6))
    common = ("--verifier", str(verifier.path), "--run-id", "bad", "--until", "prompts")
    no_ja = _cli("--languages", "en,fr,ja", "--prompts", str(en), "--prompts", str(fr), *common, home=tmp_path)
    _refused(no_ja, "no prompts for ja in en.jsonl, fr.jsonl", tmp_path)

    foreign = tmp_path / "foreign-draft"
    shutil.copytree(base_draft_dir, foreign)
    config = json.loads((foreign / "config.json").read_text())
    config["target_hidden_size"] = 960  # a draft made for a verifier of hidden size 960
    (foreign / "config.json").write_text(json.dumps(config))
    parent = _cli("--languages", "en,fr", "--prompts", str(en), "--prompts", str(fr), "--from", str(foreign), *common,
                  home=tmp_path)
    _refused(parent, f"parent draft {foreign} cannot be used with verifier", tmp_path)
    _no_registry_rows(registry_url)


def test_cli_refuses_a_draft_over_the_size_limit(tmp_path: Path, shared_data: Path, verifier, base_draft_dir: Path,
                                                 registry_url: str) -> None:
    """Before any stage: a vocabulary too large for 25 MB, and a warm start grown beyond a lower limit."""
    en = write_jsonl(tmp_path / "en.jsonl", pack_rows(shared_data, "en", "general", 4))
    fr = write_jsonl(tmp_path / "fr.jsonl", pack_rows(shared_data, "fr", "general", 4))
    common = ("--languages", "en,fr", "--prompts", str(en), "--prompts", str(fr), "--verifier", str(verifier.path),
              "--run-id", "big")
    _refused(_cli(*common, "--draft-vocab-size", "40000", home=tmp_path),
             "--draft-vocab-size 40000 gives a 56.6 MB draft; the limit is 25 MB (at most 12,729 tokens with 1 layer)",
             tmp_path)
    grown = _cli(*common, "--from", str(base_draft_dir), home=tmp_path, POLYSPEC_MAX_DRAFT_BYTES="22000000")
    _refused(grown, f"the default 12,288-token merged vocabulary, grown from the 8,192 of parent draft {base_draft_dir}, "
             "gives a 24.5 MB draft; the limit is 22 MB (at most 10,143 tokens with 1 layer)", tmp_path)
    _no_registry_rows(registry_url)


def _no_registry_rows(registry_url: str) -> None:
    from polyspec.registry import open_registry

    with open_registry(registry_url) as reg:
        assert reg.drafts() == []
