"""Language profiles: which script a language is written in, how much of it the existing draft
vocabularies cover, and whether a fine-tune can close its gap or a from-scratch draft is needed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry import artifacts
from polyspec.registry.errors import NotFound
from polyspec.registry.languages import dominant_script, read_prompts, resolve_language
from polyspec.registry.records import LanguageProfileRecord
from polyspec.registry.schema import Draft, LanguageProfile, Verifier

if TYPE_CHECKING:
    from polyspec.registry.store import Registry

PLAN_FINETUNE = "finetune"
PLAN_FROM_SCRATCH = "from-scratch-custom-vocab"
# English reference vocabulary used when no draft exists yet: the 8k most frequent English tokens,
# the draft vocabulary size of the RUNBOOK's feasibility draft (8k of the verifier's 49k).
REFERENCE_VOCAB_SIZE = 8192
# Coverage below which even a Latin-script language gets its own vocabulary; chosen from the
# measured coverages of the 12 shared training languages (docs/languages.md).
DEFAULT_COVERAGE_THRESHOLD = 0.40
# Coverage is a token fraction; an evenly spaced sample of this many prompts measures it to
# well under a percentage point and keeps add-language fast on large files.
MAX_PROMPTS = 2000


def sample_prompts(texts: list[str], limit: int) -> list[str]:
    if len(texts) <= limit:
        return texts
    step = len(texts) / limit
    return [texts[int(i * step)] for i in range(limit)]


def measure_coverage(verifier_location: str, texts: list[str], drafts: list[tuple[str, str]],
                     reference_vocab: int) -> dict[str, float]:
    """Coverage per active draft vocabulary, or of the English top-N reference when there is no draft."""
    from polyspec.models.vocab_ref import english_top_token_ids, token_coverage

    if not drafts:
        ids = english_top_token_ids(verifier_location, reference_vocab)
        return {f"en-top{reference_vocab}": float(token_coverage(verifier_location, texts, ids))}
    from polyspec.models.drafts import draft_token_ids

    tokenizer = _tokenizer(verifier_location) if len(drafts) > 1 else verifier_location
    return {
        ref: float(token_coverage(tokenizer, texts, draft_token_ids(artifacts.materialize(location))))
        for ref, location in drafts
    }


def _tokenizer(location: str) -> Any:
    from polyspec.models.vocab_ref import load_tokenizer

    return load_tokenizer(location)


def decide_plan(script: str, is_latin: bool, coverage: float, reference: str, threshold: float) -> tuple[str, str]:
    where = ("the English top-token reference vocabulary " + reference.removeprefix("en-top")
             if reference.startswith("en-top") else f"the vocabulary of draft {reference}")
    measured = f"{coverage:.1%} of the verifier's tokens fall inside {where}"
    if not is_latin:
        return PLAN_FROM_SCRATCH, (f"{script} script (not Latin): {measured}; train a draft from scratch "
                                   "with a vocabulary built from this language's tokens")
    if coverage < threshold:
        return PLAN_FROM_SCRATCH, (f"Latin script, but only {measured} (threshold {threshold:.0%}); "
                                   "train from scratch with a custom vocabulary")
    return PLAN_FINETUNE, f"Latin script and {measured} (>= {threshold:.0%}); fine-tune the existing draft"


def add_language(
    reg: Registry, code: str, prompts_file: str | Path, verifier: str | None = None, *,
    threshold: float = DEFAULT_COVERAGE_THRESHOLD, reference_vocab: int = REFERENCE_VOCAB_SIZE,
    max_prompts: int = MAX_PROMPTS,
) -> LanguageProfileRecord:
    """Profile a language from its prompts and record (upsert per language and verifier) the plan."""
    lang = resolve_language(code)
    texts = read_prompts(prompts_file)
    script = dominant_script(texts)
    ver = reg.ensure_verifier(verifier)
    with reg.session() as s:
        vid = s.scalars(select(Verifier.id).where(Verifier.name == ver.name)).one()
        active = s.scalars(select(Draft).where(Draft.verifier_id == vid, Draft.status == "active").order_by(Draft.id))
        drafts = [(f"{d.name}@{d.version}", d.location) for d in active]
    coverage = measure_coverage(ver.location, sample_prompts(texts, max_prompts), drafts, reference_vocab)
    reference, best = max(coverage.items(), key=lambda kv: kv[1])
    plan, reason = decide_plan(script.script, script.is_latin, best, reference, threshold)
    with reg.session(write=True) as s:
        vid = s.scalars(select(Verifier.id).where(Verifier.name == ver.name)).one()
        row = s.scalars(select(LanguageProfile).where(
            LanguageProfile.code == lang.code, LanguageProfile.verifier_id == vid)).first()
        if row is None:
            row = LanguageProfile(code=lang.code, verifier_id=vid)
            s.add(row)
        row.name, row.script, row.is_latin = lang.name, script.script, int(script.is_latin)
        row.coverage, row.plan, row.reason = coverage, plan, reason
        row.prompts_file, row.num_prompts = str(Path(prompts_file).expanduser().resolve()), len(texts)
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
        raise NotFound(f"no profile for {lang.code} ({lang.name}); run `polyspec registry add-language {lang.code} "
                       "--prompts FILE`")
    return found[0]
