"""One draft for several languages: the mixture, the prompts of each language, and the merged vocabulary.

    polyspec train run --languages en,fr,ja --mix equal --prompts en.jsonl --prompts fr.jsonl ...
    polyspec train run --mix en=0.5,fr=0.25,ja=0.25 ...           # explicit weights (they name the languages)
    polyspec train run --languages en,fr,ja --mix traffic ...       # the registry's live requests per language

The run's language is ``mul`` and ``RunConfig.mix`` holds the languages, the resolved weights and the
coverage target. Stage by stage:

- prompts: every file is read once, language-identified and de-duplicated; each language keeps its own
  prompts and holds out its own split (PromptsConfig.heldout_fraction, min/max_heldout); the weights then
  decide how many training prompts each language gives (``max_prompts`` is the total, default: all there are,
  each language capped at what it has). stats.json records, per language, the files it came from, the counts
  and the share asked for against the share given.
- answers, hidden states, fit: as for one language, on the mixed prompts.
- vocab: models.coverage.merge_vocab over each language's verifier answer tokens, with the coverage target for
  every language; a warm start (``--from PARENT``) keeps the parent's vocabulary and grows it, the new rows of
  the frozen lm_head taken from the verifier's lm_head, the parent's other weights kept.
- evaluate: the held-out prompts of every language, and MT-Bench of those that have one.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from polyspec.core.atomic import atomic_write_json
from polyspec.core.errors import InvalidInput
from polyspec.core.languages import UnknownLanguage, normalize_language
from polyspec.core.prompts import PromptsError
from polyspec.models.checksums import sha256_file
from polyspec.models.coverage import CoverageError, coverage, merge_vocab
from polyspec.models.draft_build import build_draft_model, load_draft, save_draft, vocab_mappings
from polyspec.models.drafts import draft_token_ids, inspect_draft
from polyspec.models.vocab_ref import english_top_token_ids
from polyspec.registry import open_registry
from polyspec.training.config import MULTILINGUAL, MixConfig, RunConfig, check_weights
from polyspec.training.errors import NoPromptsForLanguage, TrainingError
from polyspec.training.prompts import _annotate, _dedupe, _write_jsonl, read_jsonl, read_prompt_file, split_heldout
from polyspec.training.runs import console
from polyspec.training.vocab import count_tokens

MIX_VOCAB_SIZE = 12288  # the default merged vocabulary: the largest whose draft stays under 25 MB (24.5 MB)


class MixError(TrainingError, InvalidInput):
    """A multilingual run asked for something impossible: a language code, weights, a coverage target."""


# ---- the mixture (CLI and plan files) ------------------------------------------------------------------------

def parse_mix(languages: str | None, mix: str | None, coverage_target: float | None) -> dict[str, Any] | None:
    """MixConfig fields from ``--languages``, ``--mix`` and ``--coverage-target`` (None when none is given)."""
    if languages is None and mix is None and coverage_target is None:
        return None
    langs = _languages(languages) if languages else []
    source, weights, requests = "explicit", {}, None
    if mix is None or mix.strip() == "equal":
        source = "equal"
        if not langs:
            raise MixError("--mix equal needs --languages (e.g. --languages en,fr,de)")
        weights = {lang: 1.0 / len(langs) for lang in langs}
    elif mix.strip() == "traffic":
        if not langs:
            raise MixError("--mix traffic needs --languages (e.g. --languages en,fr,de)")
        source, requests = "traffic", live_requests(langs)
        total = sum(requests.values())
        if not total:
            raise MixError(f"--mix traffic: the registry records no live requests for {', '.join(langs)}",
                           hint="give the weights instead, e.g. --mix en=0.5,fr=0.5, or --mix equal")
        weights = {lang: n / total for lang, n in requests.items()}
    else:
        weights = _explicit(mix)
        if not langs:
            langs = list(weights)
    if len(langs) < 2:
        raise MixError(f"a multilingual run needs at least two languages, got {', '.join(langs) or 'none'}",
                       hint="for one language: polyspec train run LANG ...")
    try:
        check_weights(weights, langs)
    except ValueError as exc:
        raise MixError(f"--mix {mix}: {exc}") from None
    out: dict[str, Any] = {"languages": langs, "source": source, "weights": weights, "traffic_requests": requests}
    if coverage_target is not None:
        if not 0 < coverage_target <= 1:
            raise MixError(f"--coverage-target must lie in (0, 1], got {coverage_target}")
        out["coverage_target"] = coverage_target
    return MixConfig.model_validate(out).model_dump(mode="json")


def _languages(text: str) -> list[str]:
    out: list[str] = []
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        try:
            code = normalize_language(raw)
        except UnknownLanguage as exc:
            raise MixError(f"--languages: {exc}") from None
        if code in out:
            raise MixError(f"--languages names {code!r} twice")
        out.append(code)
    return out


def _explicit(text: str) -> dict[str, float]:
    """``en=0.3,fr=0.7`` -> {"en": 0.3, "fr": 0.7} (codes normalised)."""
    weights: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        lang, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise MixError(f"--mix {text!r}: expected equal, traffic or LANG=WEIGHT,..., not {item!r}")
        code = _languages(lang)[0] if lang.strip() else ""
        if not code or code in weights:
            raise MixError(f"--mix {text!r}: {'a weight without a language' if not code else f'{code!r} twice'}")
        weights[code] = number
    return weights


def live_requests(languages: list[str]) -> dict[str, int]:
    """Live requests per language, summed over routers, domains and drafts (registry live statistics)."""
    with open_registry() as reg:
        stats = reg.live_stats()
    counts: Counter[str] = Counter()
    for row in stats:
        counts[row.language] += row.requests
    return {lang: int(counts.get(lang, 0)) for lang in languages}


# ---- stage 1: prompts per language ---------------------------------------------------------------------------

def build_mix_prompts(out_dir: Path, cfg: RunConfig) -> dict[str, Any]:
    """train.jsonl (the mixture) and heldout.jsonl (every language's split), with per-language provenance."""
    mix, pc = _mix(cfg), cfg.prompts
    if not pc.files:
        raise PromptsError("no prompt file given (--prompts FILE)")
    records = [rec for path in pc.files for rec in read_prompt_file(path)]
    unique = _dedupe(records, set())
    _annotate(unique)
    found = Counter(r["lang"] for r in unique)
    per_lang = {lang: [r for r in unique if r["lang"] == lang and r["lang_confidence"] >= pc.min_langid_confidence
                       and (not pc.domain or r["domain"] == pc.domain)] for lang in mix.languages}
    empty = [lang for lang, rows in per_lang.items() if not rows]
    if empty:
        names = ", ".join(Path(p).name for p in pc.files)
        seen = ", ".join(f"{lang} ({n})" for lang, n in found.most_common(12))
        raise NoPromptsForLanguage(f"no prompts for {', '.join(empty)}{f' of domain {pc.domain!r}' if pc.domain else ''}"
                                   f" in {names}; languages found: {seen or 'none'}")
    split = {lang: split_heldout(rows, pc.model_copy(update={"max_prompts": None}), cfg.seed)
             for lang, rows in per_lang.items()}
    quota = _quotas({lang: len(train) for lang, (train, _) in split.items()}, mix.weights, pc.max_prompts)
    train, heldout, languages = [], [], {}
    for lang, (rows, held) in split.items():
        picked = rows[:quota[lang]]
        train += picked
        heldout += held
        languages[lang] = {"weight": round(mix.weights[lang], 6), "available": len(per_lang[lang]),
                           "train": len(picked), "heldout": len(held),
                           "files": dict(Counter(r["source_file"] for r in per_lang[lang]).most_common())}
    random.Random(cfg.seed).shuffle(train)
    total = len(train) or 1
    for row in languages.values():
        row["share"] = round(row["train"] / total, 4)
    _write_jsonl(out_dir / "train.jsonl", train)
    _write_jsonl(out_dir / "heldout.jsonl", heldout)
    stats = {"read": len(records), "duplicates": len(records) - len(unique), "languages_found": dict(found.most_common()),
             "kept": sum(len(r) for r in per_lang.values()), "train": len(train), "heldout": len(heldout),
             "mix": mix.source, "languages": languages,
             "files": {str(Path(p).resolve()): {"sha256": sha256_file(Path(p)),
                                                "records": sum(r["source_file"] == Path(p).name for r in records)}
                       for p in pc.files}}
    atomic_write_json(out_dir / "stats.json", stats)
    _print_mix(languages)
    return stats


def _quotas(available: dict[str, int], weights: dict[str, float], total: int | None) -> dict[str, int]:
    """Training prompts per language: ``weight * total`` (total: ``max_prompts``, else every prompt there is),
    each language capped at what it has."""
    n = total if total is not None else sum(available.values())
    return {lang: min(available[lang], round(weights[lang] * n)) for lang in available}


def _print_mix(languages: dict[str, dict[str, Any]]) -> None:
    table = Table(title="prompts per language")
    for col in ("language", "weight", "available", "train", "share", "held out"):
        table.add_column(col, justify="left" if col == "language" else "right")
    for lang, row in languages.items():
        table.add_row(lang, f"{row['weight']:.3f}", str(row["available"]), str(row["train"]), f"{row['share']:.3f}",
                      str(row["heldout"]))
    console.print(table)


def _mix(cfg: RunConfig) -> MixConfig:
    if cfg.mix is None or cfg.language != MULTILINGUAL:
        raise TrainingError(f"run {cfg.run_id!r} is not a multilingual run")
    return cfg.mix


# ---- stage 4: the merged vocabulary --------------------------------------------------------------------------

def build_mix_vocab(out_dir: Path, answers_path: Path, cfg: RunConfig, verifier: Any, parent: Path | None,
                    aux_layer_ids: list[int]) -> dict[str, Any]:
    """t2d/d2t of a vocabulary that meets the coverage target for every language; the starting draft."""
    import numpy as np
    import torch

    mix = _mix(cfg)
    rows = [r for r in read_jsonl(answers_path) if not r.get("replay")]
    counts = {lang: count_tokens([r for r in rows if r.get("lang") == lang]) for lang in mix.languages}
    counts = {lang: c for lang, c in counts.items() if c}
    parent_ids = draft_token_ids(parent) if parent else None
    size = cfg.vocab.draft_vocab_size or max(MIX_VOCAB_SIZE, len(parent_ids or ()))
    if parent_ids and size < len(parent_ids):
        raise MixError(f"--draft-vocab-size {size} is smaller than the parent draft's {len(parent_ids)} tokens, "
                       "which a warm start keeps")
    english = english_top_token_ids(verifier.path, min(size, verifier.vocab_size))
    try:
        plan = merge_vocab(counts, size, {lang: mix.coverage_target for lang in counts},
                           {lang: mix.weights[lang] for lang in counts}, required=parent_ids or (), fallback=english)
    except CoverageError as exc:
        raise MixError(f"--coverage-target {mix.coverage_target}: {exc}", hint=exc.hint) from None
    torch.save(dict(sum(counts.values(), Counter())), out_dir / "token_freq.pt")
    d2t, t2d = vocab_mappings(plan.ids, verifier.vocab_size)
    np.save(out_dir / "t2d.npy", t2d.numpy())
    np.save(out_dir / "d2t.npy", d2t.numpy())
    report = plan.to_json()
    english_set, parent_set = set(english), set(parent_ids or ())
    for lang, row in report["languages"].items():
        row["answer_tokens"] = sum(counts[lang].values())
        row[f"english_top_{len(english)}"] = round(coverage(counts[lang], english_set), 4)
        if parent_ids:
            row["parent"] = round(coverage(counts[lang], parent_set), 4)
    report["without_answers"] = [lang for lang in mix.languages if lang not in counts]
    atomic_write_json(out_dir / "coverage.json", report)
    _print_coverage(report)
    _init_mix_draft(out_dir / "init_draft", cfg, verifier, parent, plan.ids, aux_layer_ids)
    return {"draft_vocab_size": len(plan.ids), "source": "merged", "coverage_target": mix.coverage_target,
            "coverage": {lang: row["coverage"] for lang, row in report["languages"].items()},
            "grown_from": len(parent_ids) if parent_ids else None, "slots": {k: report[k] for k in (
                "required", "by_target", "by_frequency", "by_fallback")},
            "assistant_tokens": sum(sum(c.values()) for c in counts.values())}


def _print_coverage(report: dict[str, Any]) -> None:
    table = Table(title=f"coverage of each language's answer tokens by the {report['size']}-token merged vocabulary")
    for col in ("language", "answer tokens", "target", "merged", "English top-N"):
        table.add_column(col, justify="left" if col == "language" else "right")
    for lang, row in report["languages"].items():
        eng = next(v for k, v in row.items() if k.startswith("english_top_"))
        table.add_row(lang, str(row["answer_tokens"]), f"{row['target']:.1%}", f"{row['coverage']:.1%}", f"{eng:.1%}")
    console.print(table)


def _init_mix_draft(out: Path, cfg: RunConfig, verifier: Any, parent: Path | None, ids: list[int],
                    aux_layer_ids: list[int]) -> None:
    """A fresh draft on the merged vocabulary, or the parent grown to it: the parent's weights, lm_head rows
    (frozen) from the verifier's lm_head for every id of the new vocabulary."""
    layers = inspect_draft(parent).num_layers if parent else cfg.fit.num_layers
    model = build_draft_model(verifier.path, t2d_token_ids=ids, num_layers=layers, seed=cfg.seed,
                              aux_layer_ids=aux_layer_ids, k=cfg.eval.k)
    if parent is not None:
        vocab_bound = ("lm_head.", "verifier_lm_head.", "t2d", "d2t", "embed_tokens.")
        state = {k: v for k, v in load_draft(parent, verifier.path).state_dict().items() if not k.startswith(vocab_bound)}
        missing = [k for k in state if k not in model.state_dict()]
        if missing:
            raise MixError(f"parent draft {parent} has weights the grown draft lacks: {missing[:4]}")
        model.load_state_dict(state, strict=False)
    save_draft(model, out)


# ---- stage 6: held-out prompts of every language -------------------------------------------------------------

def heldout_by_language(rows: list[dict[str, Any]], limit: int | None) -> dict[str, list[str]]:
    """The last user turn of each held-out conversation, per language (at most ``limit`` each)."""
    out: dict[str, list[str]] = {}
    for row in rows:
        texts = out.setdefault(row["lang"], [])
        if limit is None or len(texts) < limit:
            texts.append(next(m["content"] for m in reversed(row["messages"]) if m["role"] == "user"))
    return out
