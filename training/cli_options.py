"""The knob flags of `polyspec train run|prompts`, mapped onto RunConfig fields.

Every flag defaults to None ("not given"), so a resumed run can tell a changed knob (refused) from an
omitted one (kept from run.json). Defaults live only in training.config.
"""


import json
from pathlib import Path
from typing import Any, Optional

import typer

from polyspec.training.config import MULTILINGUAL, RunConfig, default_run_id
from polyspec.training.multilingual import MixError, parse_mix

# flag name -> dotted RunConfig field
FIELDS: dict[str, str] = {
    "language": "language", "verifier": "verifier", "mode": "mode", "parent": "parent_draft", "seed": "seed",
    "device": "device", "prompts": "prompts.files", "domain": "prompts.domain",
    "max_prompts": "prompts.max_prompts", "heldout_fraction": "prompts.heldout_fraction",
    "replay": "prompts.replay", "engine": "answers.engine_url", "max_new_tokens": "answers.max_new_tokens",
    "temperature": "answers.temperature", "answer_batch_size": "answers.batch_size",
    "concurrency": "answers.concurrency", "aux_layers": "hidden.aux_layer_ids",
    "draft_vocab_size": "vocab.draft_vocab_size", "vocab_source": "vocab.source", "layers": "fit.num_layers",
    "epochs": "fit.epochs", "lr": "fit.lr", "warmup_steps": "fit.warmup_steps", "scheduler": "fit.scheduler",
    "total_seq_len": "fit.total_seq_len", "ttt_steps": "fit.ttt_steps",
    "ttt_step_loss_decay": "fit.ttt_step_loss_decay", "grad_clip": "fit.grad_clip", "k": "eval.k",
    "eval_method": "eval.method", "eval_languages": "eval.languages",
    "eval_max_questions": "eval.mtbench_max_questions", "eval_max_new_tokens": "eval.max_new_tokens",
    "register": "registration.enabled", "draft_name": "registration.draft_name",
    "eval_turns": "eval.mtbench_turns",
}
MIX_FLAGS = ("languages", "mix", "coverage_target")  # one RunConfig.mix, resolved by training.multilingual


def knob_signature_source(
    language: Optional[str] = typer.Argument(None, help="Target language (ISO 639-1, e.g. fr)."),
    languages: Optional[str] = typer.Option(None, "--languages", help="One draft for several languages: en,fr,de,..."),
    mix: Optional[str] = typer.Option(None, "--mix", help="With --languages: equal | traffic (the registry's live "
                                      "requests) | LANG=WEIGHT,... summing to 1."),
    coverage_target: Optional[float] = typer.Option(None, "--coverage-target", help="Share of each language's "
                                                    "answer tokens the merged vocabulary must hold (default 0.95)."),
    prompts: Optional[list[Path]] = typer.Option(None, "--prompts", help="Prompt JSONL file (repeatable)."),
    parent: Optional[str] = typer.Option(None, "--from", help="Parent draft: directory or registry NAME[@VERSION]."),
    mode: Optional[str] = typer.Option(None, help="finetune | from-scratch | from-scratch-custom-vocab."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run (default: LANG-MODE-TIMESTAMP)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run named by --run-id."),
    reuse_from: Optional[str] = typer.Option(None, "--reuse-from", help="Share the prompts, answers and hidden "
                                             "states of this earlier run (its data knobs must be equal)."),
    config: Optional[Path] = typer.Option(None, "--config", help="A run.json to start from (flags override)."),
    verifier: Optional[str] = typer.Option(None, help="Verifier alias, directory or HF id."),
    domain: Optional[str] = typer.Option(None, help="Keep one domain: code, math, medical, ..."),
    max_prompts: Optional[int] = typer.Option(None, help="Cap on target-language training prompts."),
    heldout_fraction: Optional[float] = typer.Option(None, help="Share of prompts held out for evaluation."),
    replay: Optional[list[str]] = typer.Option(None, "--replay", help="FILE:RATIO other-language prompts to mix in."),
    engine: Optional[str] = typer.Option(None, "--engine", help="vLLM engine URL for the answers."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Answer length cap (tokens)."),
    temperature: Optional[float] = typer.Option(None, help="Answer sampling temperature (0 = greedy)."),
    answer_batch_size: Optional[int] = typer.Option(None, help="transformers generate batch size."),
    concurrency: Optional[int] = typer.Option(None, help="Requests in flight to --engine."),
    aux_layers: Optional[str] = typer.Option(None, help="Verifier aux layers, e.g. 2,15,27."),
    draft_vocab_size: Optional[int] = typer.Option(None, help="Draft vocabulary size (from-scratch modes)."),
    vocab_source: Optional[str] = typer.Option(None, help="parent | english | data (default: by mode)."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Draft decoder layers (from-scratch modes)."),
    epochs: Optional[int] = typer.Option(None, help="Training epochs (default 2)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default 6e-5)."),
    warmup_steps: Optional[int] = typer.Option(None, help="Warm-up steps (default 120)."),
    scheduler: Optional[str] = typer.Option(None, help="cosine | linear | none."),
    total_seq_len: Optional[int] = typer.Option(None, help="Tokens packed per step (default 8192)."),
    ttt_steps: Optional[int] = typer.Option(None, help="Test-time-training steps (default 3)."),
    ttt_step_loss_decay: Optional[float] = typer.Option(None, help="Loss decay per ttt step (default 0.95)."),
    grad_clip: Optional[float] = typer.Option(None, help="Gradient-norm clip (default 1.0)."),
    k: Optional[int] = typer.Option(None, "-k", help="Speculative tokens for evaluation (default 3)."),
    eval_method: Optional[str] = typer.Option(None, help="offline | vllm."),
    eval_languages: Optional[str] = typer.Option(None, help="MT-Bench languages, e.g. en,fr (default: target + served)."),
    eval_max_questions: Optional[int] = typer.Option(None, help="MT-Bench questions per language."),
    eval_max_new_tokens: Optional[int] = typer.Option(None, help="Tokens generated per evaluation prompt."),
    eval_turns: Optional[str] = typer.Option(None, help="MT-Bench turns, e.g. 1,2 (default 1)."),
    register: Optional[bool] = typer.Option(None, "--register/--no-register", help="Record the candidate in the registry."),
    draft_name: Optional[str] = typer.Option(None, help="Registry name of the candidate."),
    seed: Optional[int] = typer.Option(None, help="Seed for splits, sampling and initialisation."),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Run under torchrun with N workers: answers and hidden "
                                       "states sharded, fit with FSDP (on CPU: N gloo processes)."),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="torchrun: as --gpus, with every visible GPU "
                                           "unless --gpus says how many."),
    until: Optional[str] = typer.Option(None, "--until", help="Stop after this stage."),
    redo: Optional[list[str]] = typer.Option(None, "--redo", help="Discard and rerun this stage (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print stage summaries as JSON."),
) -> None:
    """Signature donor for the run/prompts commands (never called)."""


def _set(tree: "dict[str, Any]", dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def _convert(name: str, value: Any) -> Any:
    if name == "aux_layers":
        return [int(x) for x in str(value).split(",") if x.strip()]
    if name == "eval_turns":
        return [int(x) for x in str(value).split(",") if x.strip()]
    if name == "eval_languages":
        return [x.strip() for x in str(value).split(",") if x.strip()]
    if name == "replay":
        from polyspec.training.config import ReplaySpec

        return [ReplaySpec.parse(v).model_dump(mode="json") for v in value]
    if name == "prompts":
        return [str(Path(p).expanduser().resolve()) for p in value]
    return value


def knobs_to_config(knobs: dict[str, Any], saved: Any = None) -> Any:
    """RunConfig from a run.json (``--config`` or the resumed run) plus the flags that were given."""
    if saved is not None:
        tree = saved.model_dump(mode="json")
    elif knobs.get("config"):
        tree = json.loads(Path(knobs["config"]).read_text(encoding="utf-8"))
    else:
        tree = {}
    for name, dotted in FIELDS.items():
        value = knobs.get(name)
        if value is not None and value != []:
            _set(tree, dotted, _convert(name, value))
    _set_mix(tree, knobs)
    if not tree.get("language"):
        raise typer.BadParameter("give the target LANGUAGE (e.g. `polyspec train run fr --prompts FILE`)")
    tree["run_id"] = knobs.get("run_id") or tree.get("run_id") or default_run_id(tree["language"], tree.get("mode", "finetune"))
    return RunConfig.model_validate(tree)


def _set_mix(tree: "dict[str, Any]", knobs: dict[str, Any]) -> None:
    """--languages / --mix / --coverage-target: a multilingual run (language ``mul``), from scratch on a merged
    vocabulary unless --from names a parent to grow."""
    mix = parse_mix(*(knobs.get(name) for name in MIX_FLAGS))
    if mix is None:
        return
    if knobs.get("language") not in (None, MULTILINGUAL):
        raise MixError(f"give either a LANGUAGE ({knobs['language']}) or --languages, not both")
    tree["mix"], tree["language"] = mix, MULTILINGUAL
    if not knobs.get("mode") and "mode" not in tree:
        tree["mode"] = "finetune" if tree.get("parent_draft") else "from-scratch-custom-vocab"
