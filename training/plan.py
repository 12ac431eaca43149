"""`polyspec train --plan LANG`: turn the registry's add-language plan into a RunConfig.

`polyspec registry add-language LANG --prompts FILE` records, per verifier, a plan and the prompts file. Here
that becomes a run:

- ``finetune``: fine-tune the active draft of that verifier on LANG's prompts (its vocabulary kept);
- ``from-scratch-custom-vocab``: a specialist trained from scratch, its vocabulary built from LANG's own answers
  (the active draft, when there is one, tops the vocabulary up);
- ``extend-multilingual``: the multilingual draft the profile names (else the verifier's active draft for the
  most languages) trained further on its languages plus LANG: the run `polyspec train run --languages ...
  --mix ... --from PARENT` makes, built by the same code (training.cli_options). LANG's prompts come from the
  profile; the parent's languages are replayed from the files given with ``prompts`` (a draft ships without its
  training prompts), and the prompts stage refuses a language that none of them holds. The mixture gives LANG
  ``EXTEND_SHARE`` of the training prompts and the parent's languages the rest in equal parts, unless ``mix``
  says otherwise. The vocabulary keeps the parent's and grows, from the verifier's lm_head rows, up to the
  largest whose draft stays within the draft size limit (setting ``max_draft_bytes``, 25 MB by default); when
  LANG's prompts already need more new tokens than that to reach the coverage target, the plan is refused
  before anything runs (the vocab stage checks again on the verifier's answers).

Everything else keeps the recipe defaults. Nothing here writes to the registry or creates a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyspec.core.settings import get_settings
from polyspec.models.coverage import CoverageError, merge_vocab
from polyspec.models.drafts import draft_token_ids, vocab_size_within
from polyspec.models.vocab_ref import count_tokens, load_tokenizer
from polyspec.registry import open_registry
from polyspec.registry.artifacts import materialize
from polyspec.registry.errors import NotFound
from polyspec.registry.languages import read_prompts
from polyspec.registry.profiles import MAX_PROMPTS, PLAN_EXTEND, PLAN_FINETUNE, sample_prompts
from polyspec.registry.records import DraftRecord, LanguageProfileRecord
from polyspec.training.cli_options import knobs_to_config
from polyspec.training.config import RunConfig, default_run_id
from polyspec.training.errors import PlanError
from polyspec.training.runs import Run

EXTEND_SHARE = 0.5  # LANG's share of an extend-multilingual run's training prompts; the parent's languages share the rest
_IMPORT_HINT = ("register one: polyspec registry import-draft DIR --name NAME --languages en,fr,... "
                "--status active")


def active_draft(reg: Any, verifier: str) -> Any | None:
    """The active draft of the verifier serving the default language (else the newest active one)."""
    active = [d for d in reg.drafts(verifier=verifier, status="active")]
    if not active:
        return None
    default_lang = get_settings().default_language
    preferred = [d for d in active if default_lang in d.languages]
    return (preferred or active)[-1]


def multilingual_parent(reg: Any, verifier: str, named: str | None) -> DraftRecord:
    """The draft an extend-multilingual plan grows: the registered draft the profile names, else the verifier's
    active draft made for the most languages (the newest among equals). PlanError when there is none, or when
    the named one is for another verifier, retired, or made for one language."""
    if named:
        try:
            record = reg.get_draft(named)
        except NotFound:
            record = None  # a shipped draft the registry does not hold: the registry's own are the choice
        if record is not None:
            if record.verifier != verifier:
                raise PlanError(f"the plan names parent draft {record.ref}, which is made for verifier "
                                f"{record.verifier}, not {verifier}; re-run `polyspec registry add-language` for "
                                f"verifier {verifier}")
            if record.status == "retired" or len(record.languages) < 2:
                why = "retired" if record.status == "retired" else f"made for {', '.join(record.languages)} alone"
                raise PlanError(f"the plan names parent draft {record.ref}, which is {why}; re-run "
                                "`polyspec registry add-language` to plan again")
            return record
    multi = [d for d in reg.drafts(verifier=verifier, status="active") if len(d.languages) > 1]
    if not multi:
        named_note = f" (the plan names {named}, which the registry does not hold)" if named else ""
        raise PlanError(f"no active multilingual draft of verifier {verifier} is registered{named_note}; "
                        f"{_IMPORT_HINT}")
    return max(multi, key=lambda d: (len(d.languages), d.created_at is not None, d.created_at, d.version))


def config_from_plan(language: str, *, run_id: str | None = None, resume: bool = False,
                     max_prompts: int | None = None, engine: str | None = None, prompts: list[Path] | None = None,
                     mix: str | None = None, coverage_target: float | None = None) -> RunConfig:
    """The RunConfig of LANG's add-language plan. ``prompts``, ``mix`` and ``coverage_target`` are for an
    extend-multilingual plan only: the parent's languages' prompt files, the mixture (``equal``, ``traffic`` or
    ``LANG=WEIGHT,...``; default: LANG ``EXTEND_SHARE``, the rest equal) and the coverage target."""
    verifier = get_settings().default_verifier
    with open_registry() as reg:
        try:
            profile = reg.get_language(language, verifier=verifier)
        except NotFound:
            raise PlanError(f"no add-language plan for {language!r} (verifier {verifier}); run "
                            f"`polyspec registry add-language {language} --prompts FILE` first") from None
        extend = profile.plan == PLAN_EXTEND
        parent = multilingual_parent(reg, verifier, profile.draft) if extend else active_draft(reg, verifier)
        verifier_location = reg.get_verifier(verifier).location
    _check_prompts_file(profile)
    extras = {"--prompts": prompts, "--mix": mix, "--coverage-target": coverage_target}
    given = [flag for flag, value in extras.items() if value]
    if given and not extend:
        raise PlanError(f"{', '.join(given)}: only for an extend-multilingual plan; the plan for "
                        f"{profile.language!r} is {profile.plan}, which trains on its profile's prompts alone")
    if profile.plan == PLAN_FINETUNE and parent is None:
        raise PlanError(f"plan for {profile.language!r} is finetune but verifier {verifier} has no active draft; "
                        "promote one or train from scratch with `polyspec train run`")
    if resume and run_id:
        return Run.open(run_id).config
    if extend:
        return _extend_config(profile, parent, verifier, verifier_location, run_id=run_id, max_prompts=max_prompts,
                              engine=engine, prompts=list(prompts or []), mix=mix, coverage_target=coverage_target)
    mode = "finetune" if profile.plan == PLAN_FINETUNE else "from-scratch-custom-vocab"
    tree: dict[str, Any] = {
        "run_id": run_id or default_run_id(profile.language, mode),
        "language": profile.language,
        "verifier": verifier,
        "mode": mode,
        "parent_draft": parent.ref if parent is not None else None,
        "prompts": {"files": [profile.prompts_file], **({"max_prompts": max_prompts} if max_prompts else {})},
        "answers": {"engine_url": engine} if engine else {},
    }
    return RunConfig.model_validate(tree)


def _check_prompts_file(profile: LanguageProfileRecord) -> None:
    if not profile.prompts_file:
        raise PlanError(f"the {profile.language!r} profile records no prompts file; re-run add-language with --prompts")
    if not Path(profile.prompts_file).is_file():
        raise PlanError(f"the {profile.language!r} profile's prompts file {profile.prompts_file} is gone; re-run "
                        f"`polyspec registry add-language {profile.language} --prompts FILE`")


def _extend_config(profile: LanguageProfileRecord, parent: DraftRecord, verifier: str, verifier_location: str, *,
                   run_id: str | None, max_prompts: int | None, engine: str | None, prompts: list[Path],
                   mix: str | None, coverage_target: float | None) -> RunConfig:
    """`polyspec train run --languages PARENT'S+LANG --mix ... --from PARENT`, the vocabulary grown to the size cap."""
    lang = profile.language
    others = [code for code in parent.languages if code != lang]
    if not prompts:
        raise PlanError(f"plan extend-multilingual for {lang!r} trains {parent.ref} on {lang} and replays its "
                        f"languages {', '.join(others)}, whose prompts are not shipped with the draft: give them "
                        "with --prompts FILE (repeatable; JSONL prompts, e.g. captured traffic)")
    missing = [str(p) for p in prompts if not Path(p).is_file()]
    if missing:
        raise PlanError(f"--prompts: no such file: {', '.join(missing)}")
    parent_dir = materialize(parent.location)
    room = vocab_size_within(parent_dir, get_settings().max_draft_bytes)
    knobs = {"languages": ",".join([*others, lang]), "mix": mix or _default_mix(lang, others),
             "coverage_target": coverage_target, "parent": parent.ref, "verifier": verifier,
             "prompts": [Path(profile.prompts_file), *prompts], "max_prompts": max_prompts, "engine": engine,
             "draft_vocab_size": room, "draft_name": parent.name,
             "run_id": run_id or default_run_id(lang, PLAN_EXTEND)}
    config = knobs_to_config(knobs)
    _check_room(profile, parent, parent_dir, room, config.mix.coverage_target, verifier_location)
    return config


def _default_mix(lang: str, others: list[str]) -> str:
    rest = (1.0 - EXTEND_SHARE) / len(others)
    return ",".join([f"{lang}={EXTEND_SHARE!r}", *(f"{code}={rest!r}" for code in others)])


def _check_room(profile: LanguageProfileRecord, parent: DraftRecord, parent_dir: Path, room: int, target: float,
                verifier_location: str) -> None:
    """Refuse when the coverage target for LANG's prompt tokens needs more new vocabulary rows than fit the cap."""
    kept = draft_token_ids(parent_dir)
    limit = f"the {get_settings().max_draft_bytes / 1e6:g} MB limit of a draft (POLYSPEC_MAX_DRAFT_BYTES)"
    if room < len(kept):
        raise PlanError(f"parent draft {parent.ref} has {len(kept)} tokens, more than the {room} a draft of its "
                        f"shape holds within {limit}; extend a smaller draft")
    texts = sample_prompts(read_prompts(profile.prompts_file), MAX_PROMPTS)
    counts = {profile.language: count_tokens(load_tokenizer(verifier_location), texts)}
    try:
        merge_vocab(counts, room, {profile.language: target}, required=kept)
    except CoverageError:
        alone = merge_vocab(counts, len(kept) + len(counts[profile.language]), {profile.language: target},
                            required=kept)
        best = merge_vocab(counts, room, {profile.language: 0.0}, required=kept).coverage[profile.language]
        raise PlanError(
            f"plan extend-multilingual for {profile.language!r} cannot meet coverage target {target:.1%} within "
            f"{limit}: its prompts ({profile.prompts_file}) need {alone.by_target} tokens beyond the {len(kept)} of "
            f"{parent.ref}, and a draft of its shape holds {room} ({room - len(kept)} more), which cover "
            f"{best:.1%}; lower --coverage-target or train a specialist "
            f"(polyspec train run {profile.language} --prompts FILE --mode from-scratch-custom-vocab)") from None
