"""Language profiles: which script a language is written in, which existing draft already covers it (measured
or predicted acceptance, vocabulary coverage: registry.covering), and what to train for it: extend the
multilingual draft, fine-tune a draft, or train a specialist from scratch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry import artifacts
from polyspec.registry.covering import MEASURED, PREDICTED, UNSEEN_SCRIPT, Candidate, Fit, assess
from polyspec.registry.errors import InvalidProfile, NotFound
from polyspec.registry.languages import dominant_script, read_prompts, resolve_language
from polyspec.registry.records import LanguageProfileRecord
from polyspec.registry.samples import has_sample, read_sample
from polyspec.registry.schema import Draft, Evaluation, LanguageProfile, Verifier

if TYPE_CHECKING:
    from polyspec.registry.store import Registry

PLAN_EXTEND = "extend-multilingual"
PLAN_FINETUNE = "finetune"
PLAN_FROM_SCRATCH = "from-scratch-custom-vocab"
PLANS = (PLAN_EXTEND, PLAN_FINETUNE, PLAN_FROM_SCRATCH)
# English reference vocabulary used when no draft exists yet: the 8k most frequent English tokens,
# the draft vocabulary size of the RUNBOOK's feasibility draft (8k of the verifier's 49k).
REFERENCE_VOCAB_SIZE = 8192
# Coverage below which even a draft made for the language's script is no start for it; chosen from the
# measured coverages of the data-pack languages (docs/languages.md).
DEFAULT_COVERAGE_THRESHOLD = 0.40
# Coverage is a token fraction; an evenly spaced sample of this many prompts measures it to
# well under a percentage point and keeps add-language fast on large files.
MAX_PROMPTS = 2000


def sample_prompts(texts: list[str], limit: int) -> list[str]:
    if len(texts) <= limit:
        return texts
    step = len(texts) / limit
    return [texts[int(i * step)] for i in range(limit)]


class _Texts:
    """Token counts and scripts of the bundled samples, read once per add-language."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._counts: dict[str, Counter[int] | None] = {}
        self._scripts: dict[str, str | None] = {}

    def count(self, texts: list[str]) -> Counter[int]:
        from polyspec.models.coverage import token_counts
        from polyspec.models.vocab_ref import encode_ids

        return token_counts(encode_ids(self.tokenizer, t) for t in texts)

    def counts(self, lang: str) -> Counter[int] | None:
        if lang not in self._counts:
            self._counts[lang] = self.count(read_sample(lang)) if has_sample(lang) else None
        return self._counts[lang]

    def script(self, lang: str) -> str | None:
        if lang not in self._scripts:
            self._scripts[lang] = dominant_script(read_sample(lang)).script if has_sample(lang) else None
        return self._scripts[lang]


def candidates(reg: Registry, verifier: str, *, shipped: bool = True) -> list[Candidate]:
    """The drafts that might serve a language: the verifier's general drafts in the registry that are not
    retired, then (``shipped``) the shipped drafts for it that are not registered under their name."""
    from polyspec.models.drafts import draft_token_ids

    with reg.session() as s:
        vid = s.scalars(select(Verifier.id).where(Verifier.name == verifier)).one()
        rows = s.scalars(select(Draft).where(Draft.verifier_id == vid, Draft.status != "retired",
                                             Draft.domain == "general").order_by(Draft.id)).all()
        found = [(f"{d.name}@{d.version}", d.name, list(d.languages or []), d.location,
                  [_row(e) for e in s.scalars(select(Evaluation).where(Evaluation.draft_id == d.id,
                                                                        Evaluation.domain == "general"))])
                 for d in rows]
    out = [Candidate(ref, langs, frozenset(draft_token_ids(artifacts.materialize(location))), evals)
           for ref, _, langs, location, evals in found]
    if shipped:
        from polyspec.models.shipped import shipped_drafts

        names = {name for _, name, *_ in found}
        out += [Candidate(d.name, list(d.languages), frozenset(draft_token_ids(d.path)),
                          [e for e in d.evaluations if e.get("domain", "general") == "general"], shipped=True)
                for d in shipped_drafts(verifier) if d.name not in names]
    return out


def _row(e: Evaluation) -> dict[str, Any]:
    return {"language": e.language, "benchmark": e.benchmark, "subset": e.subset,
            "mean_acceptance_length": e.mean_acceptance_length}


def _acceptance(fit: Fit) -> str:
    if fit.acceptance is None:
        return "no acceptance figure to go by"
    if fit.basis == MEASURED:
        return f"measured mean acceptance length {fit.acceptance:.2f}"
    if fit.basis == PREDICTED:
        return f"predicted mean acceptance length {fit.acceptance:.2f} (its {fit.reference} figure scaled by coverage)"
    return (f"predicted mean acceptance length {fit.acceptance:.2f} (drafts on scripts they were not trained on, "
            "median)")


def decide(lang: str, script: str, is_latin: bool, fits: list[Fit], threshold: float) -> tuple[str, str]:
    """The plan and its reason, from the best fit (``fits`` come best first)."""
    best = fits[0]
    held = f"{best.draft} holds {best.coverage:.1%} of the verifier's tokens on {lang}, {_acceptance(best)}"
    flag = "" if is_latin else " (not Latin)"
    if not best.covers_script:
        return PLAN_FROM_SCRATCH, (f"{script} script{flag}: no draft is made for a language of this script; {held}; "
                                   "train a specialist from scratch with a vocabulary built from this language's tokens")
    if best.coverage < threshold:
        return PLAN_FROM_SCRATCH, (f"{script} script{flag}: {held}, below the {threshold:.0%} threshold; train a "
                                   "specialist from scratch with a vocabulary built from this language's tokens")
    if best.multilingual:
        return PLAN_EXTEND, (f"{script} script{flag}: {held}; extend the multilingual draft: train it on {lang} too, "
                             f"warm-started from {best.draft}")
    return PLAN_FINETUNE, f"{script} script{flag}: {held}; fine-tune {best.draft} on {lang}"


def decide_without_drafts(script: str, is_latin: bool, coverage: float, reference: str,
                          threshold: float) -> tuple[str, str]:
    """No draft for the verifier yet: the English top-token reference vocabulary stands in for one."""
    measured = (f"{coverage:.1%} of the verifier's tokens fall inside the English top-token reference vocabulary "
                + reference.removeprefix("en-top"))
    if not is_latin:
        return PLAN_FROM_SCRATCH, (f"{script} script (not Latin): {measured}; train a draft from scratch "
                                   "with a vocabulary built from this language's tokens")
    if coverage < threshold:
        return PLAN_FROM_SCRATCH, (f"Latin script, but only {measured} (threshold {threshold:.0%}); "
                                   "train from scratch with a custom vocabulary")
    return PLAN_FINETUNE, f"Latin script and {measured} (>= {threshold:.0%}); fine-tune the English draft"


def add_language(
    reg: Registry, code: str, prompts_file: str | Path | None = None, verifier: str | None = None, *,
    threshold: float = DEFAULT_COVERAGE_THRESHOLD, reference_vocab: int = REFERENCE_VOCAB_SIZE,
    max_prompts: int = MAX_PROMPTS, shipped: bool = False,
) -> LanguageProfileRecord:
    """Profile a language and record (upsert per language and verifier) which draft covers it and the plan.

    The drafts weighed are the registry's; ``shipped`` adds the shipped drafts not registered yet (what
    `polyspec registry add-language` does by default; a training run's parent must be in the registry).

    Coverage and script come from the language's bundled sample (registry/data) when there is one, else from
    ``prompts_file``; the prompts file is recorded for ``polyspec train --plan``. Nothing is written on error."""
    if not 0.0 <= threshold <= 1.0:
        raise InvalidProfile(f"--threshold must lie between 0 and 1, got {threshold}")
    lang = resolve_language(code)
    prompts = read_prompts(prompts_file) if prompts_file is not None else None
    texts = read_sample(lang.code) if has_sample(lang.code) or prompts is None else sample_prompts(prompts, max_prompts)
    script = dominant_script(texts)
    ver = reg.ensure_verifier(verifier)
    from polyspec.models.vocab_ref import english_top_token_ids, load_tokenizer

    samples = _Texts(load_tokenizer(ver.location))
    counts = samples.count(texts)
    cands = candidates(reg, ver.name, shipped=shipped)
    fits = assess(lang.code, counts, script.script, cands, samples.counts, samples.script) if cands else []
    if fits:
        plan, reason = decide(lang.code, script.script, script.is_latin, fits, threshold)
        coverage = {f.draft: f.coverage for f in fits}
    else:
        from polyspec.models.coverage import coverage as share

        ref = f"en-top{reference_vocab}"
        coverage = {ref: share(counts, english_top_token_ids(ver.location, reference_vocab))}
        plan, reason = decide_without_drafts(script.script, script.is_latin, coverage[ref], ref, threshold)
    best = fits[0] if fits else None
    details = {"fits": [f.to_json() for f in fits], "text": "bundled sample" if texts is not prompts else "prompts",
               "texts": len(texts), "threshold": threshold}
    with reg.session(write=True) as s:
        vid = s.scalars(select(Verifier.id).where(Verifier.name == ver.name)).one()
        row = s.scalars(select(LanguageProfile).where(
            LanguageProfile.code == lang.code, LanguageProfile.verifier_id == vid)).first()
        if row is None:
            row = LanguageProfile(code=lang.code, verifier_id=vid)
            s.add(row)
        row.name, row.script, row.is_latin = lang.name, script.script, int(script.is_latin)
        row.coverage, row.plan, row.reason, row.details = coverage, plan, reason, details
        row.draft = best.draft if best else None
        row.acceptance = best.acceptance if best else None
        row.acceptance_basis = best.basis if best else None
        row.prompts_file = str(Path(prompts_file).expanduser().resolve()) if prompts_file is not None else None
        row.num_prompts = len(prompts) if prompts is not None else 0
        s.flush()
        return LanguageProfileRecord.of(row, ver.name)


def _verifier_names(session: Session) -> dict[int, str]:
    return {vid: name for vid, name in session.execute(select(Verifier.id, Verifier.name))}


def list_profiles(session: Session, *, verifier: str | None = None) -> list[LanguageProfileRecord]:
    names = _verifier_names(session)
    rows = session.scalars(select(LanguageProfile).order_by(LanguageProfile.code))
    out = [LanguageProfileRecord.of(r, names.get(r.verifier_id)) for r in rows]
    return [p for p in out if verifier is None or p.verifier == verifier]


def get_profile(session: Session, code: str, *, verifier: str | None = None) -> LanguageProfileRecord:
    lang = resolve_language(code)
    found = [p for p in list_profiles(session, verifier=verifier) if p.language == lang.code]
    if not found:
        raise NotFound(f"no profile for {lang.code} ({lang.name}); run `polyspec registry add-language {lang.code}`")
    return found[0]


__all__ = ["DEFAULT_COVERAGE_THRESHOLD", "PLANS", "PLAN_EXTEND", "PLAN_FINETUNE", "PLAN_FROM_SCRATCH", "UNSEEN_SCRIPT",
           "add_language", "candidates", "decide", "get_profile", "list_profiles"]
