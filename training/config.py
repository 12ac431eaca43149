"""Every knob of a training run, in one pydantic model saved as ``run.json``.

Defaults are the founding recipe (French fine-tune of an English Eagle3 draft): 2 epochs, lr 6e-5,
cosine schedule with 120 warm-up steps, 8192-token packing, ttt-steps 3, ttt-step-loss-decay 0.95,
1 draft layer, AdamW. The CLI only maps flags onto these fields; nothing else holds a default.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polyspec.core.languages import MULTILINGUAL  # the language of a run over several languages

Mode = Literal["finetune", "from-scratch", "from-scratch-custom-vocab"]
VocabSource = Literal["parent", "english", "data"]
STAGES: tuple[str, ...] = ("prompts", "answers", "hidden-states", "vocab", "fit", "evaluate", "register")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplaySpec(_Strict):
    """Other-language prompts mixed into the training set: ``ratio`` replay prompts per target prompt."""

    path: Path
    ratio: float = Field(gt=0, le=10)

    @classmethod
    def parse(cls, text: str) -> ReplaySpec:
        """``FILE:RATIO`` (``RATIO`` defaults to 1 when omitted)."""
        path, sep, ratio = text.rpartition(":")
        if not sep or not ratio.replace(".", "", 1).isdigit():
            return cls(path=Path(text), ratio=1.0)
        return cls(path=Path(path), ratio=float(ratio))


class PromptsConfig(_Strict):
    files: list[Path] = Field(default_factory=list, description="JSONL prompt files (data-pack, {prompt} or {messages}).")
    domain: str | None = Field(default=None, description="Keep only this domain (field, or detection when unlabeled).")
    max_prompts: int | None = Field(default=None, ge=1, description="Cap on target-language training prompts.")
    heldout_fraction: float = Field(default=0.1, ge=0, lt=1)
    min_heldout: int = Field(default=1, ge=0)
    max_heldout: int = Field(default=200, ge=0)
    min_langid_confidence: float = Field(default=0.3, ge=0, le=1)
    replay: list[ReplaySpec] = Field(default_factory=list)


class AnswersConfig(_Strict):
    engine_url: str | None = Field(default=None, description="Running vLLM engine; None = transformers generate.")
    max_new_tokens: int = Field(default=512, ge=1)
    max_prompt_tokens: int = Field(default=2048, ge=8, description="Longer templated prompts are skipped.")
    temperature: float = Field(default=0.0, ge=0, description="0 = greedy.")
    batch_size: int = Field(default=16, ge=1, description="transformers generate batch size.")
    concurrency: int = Field(default=32, ge=1, description="In-flight requests to the engine.")
    retries: int = Field(default=4, ge=0)
    backoff_s: float = Field(default=1.0, ge=0, description="First retry delay; doubles per retry (jittered).")
    max_backoff_s: float = Field(default=30.0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)


class HiddenConfig(_Strict):
    aux_layer_ids: list[int] | None = Field(default=None, description="Default [2, n//2, n-3] of the verifier.")
    batch_size: int = Field(default=8, ge=1, description="Sequences per verifier forward pass.")
    max_batch_tokens: int = Field(default=16384, ge=64, description="Padded tokens per verifier forward pass.")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"


class VocabConfig(_Strict):
    draft_vocab_size: int | None = Field(default=None, ge=16, description="None = the parent's size, else 8192.")
    source: VocabSource | None = Field(default=None, description="None = by mode (parent / english / data).")


class FitConfig(_Strict):
    epochs: int = Field(default=2, ge=1)
    lr: float = Field(default=6e-5, gt=0)
    scheduler: Literal["cosine", "linear", "none"] = "cosine"
    warmup_steps: int = Field(default=120, ge=0)
    weight_decay: float = Field(default=0.01, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    ttt_steps: int = Field(default=3, ge=1)
    ttt_step_loss_decay: float = Field(default=0.95, gt=0)
    total_seq_len: int = Field(default=8192, ge=64, description="Packing budget per step (tokens).")
    num_layers: int = Field(default=1, ge=1, description="Draft decoder layers (from-scratch modes).")
    loss_fn: str = "kl_div"
    attn_impl: Literal["sdpa", "eager", "simple_flex_attention"] = "sdpa"
    keep_checkpoints: int = Field(default=2, ge=1, description="End-of-epoch checkpoints kept (all: a learning curve).")


class EvalConfig(_Strict):
    k: int = Field(default=3, ge=1)
    method: Literal["offline", "vllm"] = "offline"
    languages: list[str] | None = Field(default=None, description="MT-Bench languages; None = target + served.")
    mtbench_max_questions: int | None = Field(default=None, ge=1, description="None = all 80 per language.")
    mtbench_turns: list[int] = Field(default=[1], min_length=1, description="[1, 2]: MT-Bench-160 (both turns).")
    heldout_max_prompts: int | None = Field(default=None, ge=1)
    max_new_tokens: int = Field(default=256, ge=1)
    evaluate_parent: bool = Field(default=True, description="Measure the parent draft on the same prompts.")


class MixConfig(_Strict):
    """A multilingual run: the languages of one draft, how much of each, and the vocabulary coverage each needs.

    ``weights`` is the mixture, as given (``explicit``) or resolved when the run was made (``equal``, or
    ``traffic``: the registry's live request counts, kept in ``traffic_requests``); it decides each language's
    share of the training prompts. ``coverage_target``: the share of each language's verifier answer tokens the
    merged draft vocabulary must hold (models.coverage.merge_vocab).
    """

    languages: list[str] = Field(min_length=2, description="ISO 639 codes of the languages the draft serves.")
    source: Literal["equal", "traffic", "explicit"] = "equal"
    weights: dict[str, float] = Field(description="Share of the training prompts per language (sums to 1).")
    traffic_requests: dict[str, int] | None = Field(default=None, description="Live requests behind source=traffic.")
    coverage_target: float = Field(default=0.95, gt=0, le=1)

    @field_validator("languages")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"languages listed twice: {sorted({v for v in value if value.count(v) > 1})}")
        return value

    @model_validator(mode="after")
    def _weights_ok(self) -> MixConfig:
        check_weights(self.weights, self.languages)
        return self


def check_weights(weights: dict[str, float], languages: list[str]) -> None:
    """Mixture weights: one per language, none negative, summing to 1 (within 1e-6)."""
    negative = {lang: w for lang, w in weights.items() if w < 0}
    if negative:
        raise ValueError(f"mixture weights must not be negative: {negative}")
    extra, missing = sorted(set(weights) - set(languages)), sorted(set(languages) - set(weights))
    if extra or missing:
        raise ValueError(f"mixture weights must name exactly the run's languages"
                         f"{f'; not in --languages: {extra}' if extra else ''}{f'; missing: {missing}' if missing else ''}")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"mixture weights must sum to 1, they sum to {total:.6g}: {weights}")


class RegisterConfig(_Strict):
    enabled: bool = True
    draft_name: str | None = Field(default=None, description="Default: {verifier}-{language}-{domain}.")


class RunConfig(_Strict):
    """The single source of truth for one run; saved as runs/RUN_ID/run.json."""

    run_id: str
    language: str
    verifier: str = "smollm2-135m-instruct"
    mode: Mode = "finetune"
    parent_draft: str | None = Field(default=None, description="Draft dir or registry name[@version].")
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    answers: AnswersConfig = Field(default_factory=AnswersConfig)
    hidden: HiddenConfig = Field(default_factory=HiddenConfig)
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    fit: FitConfig = Field(default_factory=FitConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    registration: RegisterConfig = Field(default_factory=RegisterConfig)
    mix: MixConfig | None = Field(default=None, description="Several languages in one draft (language 'mul').")

    @field_validator("run_id")
    @classmethod
    def _run_id_ok(cls, value: str) -> str:
        if not _RUN_ID.match(value):
            raise ValueError("run id: letters, digits, '.', '_' and '-' only (max 100 chars)")
        return value

    @field_validator("language")
    @classmethod
    def _lang_ok(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2,3}", value):
            raise ValueError(f"language must be an ISO 639 code like 'fr', got {value!r}")
        return value

    @model_validator(mode="after")
    def _mix_ok(self) -> RunConfig:
        if self.mix is not None and self.language != MULTILINGUAL:
            raise ValueError(f"a run over several languages has language {MULTILINGUAL!r}, got {self.language!r}")
        return self

    @property
    def languages(self) -> list[str]:
        """The languages the draft is for: the mixture's, or the one target language."""
        return list(self.mix.languages) if self.mix is not None else [self.language]

    @property
    def vocab_source(self) -> VocabSource:
        if self.vocab.source is not None:
            return self.vocab.source
        if self.mode == "finetune":
            return "parent"
        if self.mode == "from-scratch-custom-vocab":
            return "data"
        return "parent" if self.parent_draft else "english"

    @property
    def domain(self) -> str:
        return self.prompts.domain or "general"


def default_run_id(language: str, mode: str) -> str:
    """A sortable, readable id: fr-finetune-20261130-142501."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{language}-{mode}-{stamp}"
