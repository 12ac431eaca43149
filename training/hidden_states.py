"""Stage 3: verifier hidden states, written in speculators' offline-training format.

The stage directory is a speculators ``--data-path``:

    hidden-states/
      data-00000-of-00001.arrow, dataset_info.json, state.json   HF datasets index (save_to_disk), torch format:
          input_ids [T] int64, loss_mask [T] int64, seq_len int64 — one row per answers.jsonl line
      hidden_states/hs_{i}.safetensors                             one file per row i:
          token_ids [T] int64, hidden_states [T, len(aux)+1, H]    (aux layers..., last PRE-norm), bf16

exactly what ``speculators.train.data.ArrowDataset`` + ``hs_connectors.FileTransfer`` read (our own
trainer reads it through those same classes). Aux layer L = transformers' ``output_hidden_states[L]``
(vLLM's convention); the last state is the input of the final norm (models.hidden).
Files are written atomically and skipped when present, so an interrupted stage resumes. Under torchrun
(training.distributed) rank r writes the files of rows r::N and rank 0 writes the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_path
from polyspec.models.hidden import capture_hidden_states_batched, load_verifier_model
from polyspec.training.config import HiddenConfig
from polyspec.training.prompts import read_jsonl
from polyspec.training.runs import console

HS_DIR = "hidden_states"


def default_aux_layers(num_layers: int) -> list[int]:
    """[2, n//2, n-3]: speculators' and vLLM's default Eagle3 aux layers."""
    return [2, num_layers // 2, num_layers - 3]


def hs_path(data_dir: Path, index: int) -> Path:
    return data_dir / HS_DIR / f"hs_{index}.safetensors"


def _save_hs(path: Path, token_ids: list[int], aux: Any, last: Any, dtype: Any) -> None:
    import torch
    from safetensors.torch import save_file

    hidden = torch.cat([aux, last.unsqueeze(1)], dim=1).to(dtype).contiguous()  # [T, len(aux)+1, H]
    with atomic_path(path) as tmp:
        save_file({"token_ids": torch.tensor(token_ids, dtype=torch.long), "hidden_states": hidden}, str(tmp))


def write_index(data_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The HF datasets index speculators' ArrowDataset loads with ``load_from_disk``."""
    from datasets import Dataset, Features, Sequence, Value

    features = Features({
        "input_ids": Sequence(Value("int64")),
        "loss_mask": Sequence(Value("int64")),
        "seq_len": Value("int64"),
    })
    ds = Dataset.from_dict(
        {
            "input_ids": [r["input_ids"] for r in rows],
            "loss_mask": [r["loss_mask"] for r in rows],
            "seq_len": [len(r["input_ids"]) for r in rows],
        },
        features=features,
    )
    ds.set_format(type="torch")
    ds.save_to_disk(str(data_dir))


def build_hidden_states(
    out_dir: Path, answers_path: Path, verifier_path: Path, aux_layer_ids: list[int], cfg: HiddenConfig, device: str
) -> dict[str, Any]:
    rows = read_jsonl(answers_path)
    write_hidden_files(out_dir, rows, range(len(rows)), verifier_path, aux_layer_ids, cfg, device)
    return finish_hidden_states(out_dir, rows, aux_layer_ids, cfg)


def write_hidden_files(out_dir: Path, rows: list[dict[str, Any]], indices: Iterable[int], verifier_path: Path,
                       aux_layer_ids: list[int], cfg: HiddenConfig, device: str) -> int:
    """The hidden-state files of ``rows[i]`` for each i in ``indices`` not on disk yet; returns how many were wanted."""
    import torch

    wanted = list(indices)
    (out_dir / HS_DIR).mkdir(parents=True, exist_ok=True)
    todo = [i for i in wanted if not hs_path(out_dir, i).is_file()]
    if len(todo) < len(wanted):
        console.print(f"resuming: {len(wanted) - len(todo)} hidden-state files already on disk, {len(todo)} to go")
    dtype = getattr(torch, cfg.dtype)
    if todo:
        model, _ = load_verifier_model(verifier_path, device=device)
        sequences = [rows[i]["input_ids"] for i in todo]
        stream = capture_hidden_states_batched(
            model, sequences, aux_layer_ids, max_batch_tokens=cfg.max_batch_tokens, max_batch_size=cfg.batch_size, progress=True,
        )
        for j, aux, last in stream:
            i = todo[j]
            _save_hs(hs_path(out_dir, i), rows[i]["input_ids"], aux, last, dtype)
    return len(wanted)


def finish_hidden_states(out_dir: Path, rows: list[dict[str, Any]], aux_layer_ids: list[int],
                         cfg: HiddenConfig) -> dict[str, Any]:
    """The index over every row's file (all written by now) and the stage summary."""
    write_index(out_dir, rows)
    return {
        "samples": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "aux_layer_ids": list(aux_layer_ids),
        "dtype": cfg.dtype,
        "format": "speculators offline (ArrowDataset + FileTransfer)",
    }
