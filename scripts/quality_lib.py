"""Pieces of scripts/quality_gpu.py (training at scale on the H200): the MT-Bench evaluator, answering a prompt pool
under a time budget, and the files a draft travels back in.

Evaluation is `polyspec eval`'s offline method (training.eval_offline.OfflineScorer: the verifier's greedy
answers to every turn of the nine bundled MT-Bench files, turn 2 after its own turn-1 answer, k=3, 256 new
tokens), reported per language over all answers and over non-degenerate ones (training.eval_api.figures,
models.degenerate's default measure).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from polyspec.core.acceptance import mal_from_histogram, merge_histograms
from polyspec.core.atomic import atomic_write_json

K = 3
MAX_NEW_TOKENS = 256
BENCHMARK = "mtbench-160"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Evaluator:
    """The verifier's MT-Bench trajectories (all nine languages), computed once; drafts scored on them."""

    def __init__(self, verifier: Any, aux: list[int], device: str, limit: int | None, batch_size: int,
                 max_new_tokens: int = MAX_NEW_TOKENS):
        from polyspec.models.degenerate import answer_shape
        from polyspec.training.benchmarks import load_benchmark, mtbench_languages
        from polyspec.training.eval_api import Answer
        from polyspec.training.eval_offline import OfflineScorer
        from polyspec.training.eval_options import EvalOptions

        t0 = time.time()
        items = [it for lang in mtbench_languages() for it in load_benchmark(f"mtbench:{lang}", "all", limit=limit)]
        options = EvalOptions(k=K, max_new_tokens=max_new_tokens, device=device, batch_size=batch_size, progress=False)
        self.scorer = OfflineScorer(verifier, items, options, aux)
        self.max_new_tokens = max_new_tokens
        self.answers = [Answer(it, it.language or "und", answer_shape(self.scorer.answer_ids(i)))
                        for i, it in enumerate(items)]
        self.languages = sorted({a.language for a in self.answers})
        self.seconds = round(time.time() - t0, 1)

    def answer_report(self, tokenizer: Any) -> list[dict[str, Any]]:
        """Every verifier answer: id, turn, language, both degenerate measures and the text (for inspection)."""
        out = []
        for i, a in enumerate(self.answers):
            ids = self.scorer.answer_ids(i)
            out.append({"id": a.item.id, "turn": a.item.turn, "language": a.language, "tokens": a.shape.tokens,
                        "distinct_ratio": a.shape.distinct_ratio, "repeated_ngram_share": a.shape.repeated_ngram_share,
                        "degenerate": a.shape.degenerate, "text": tokenizer.decode(ids, skip_special_tokens=True)})
        return out

    def answer_token_counts(self, language: str) -> Counter[int]:
        return Counter(t for i, a in enumerate(self.answers) if a.language == language for t in self.scorer.answer_ids(i))

    def score(self, model: Any, languages: list[str] | None = None, batch: int = 160) -> dict[int, Any]:
        """PromptAcceptance per item index (only items of ``languages`` when given). The draft is copied:
        the scorer casts what it measures to bf16, and a draft may still be training."""
        import torch

        from polyspec.models.acceptance_tf import chain_lengths, replay

        draft = copy.deepcopy(model).eval().to(device=self.scorer.device, dtype=self.scorer.dtype)
        wanted = [i for i, a in enumerate(self.answers) if languages is None or a.language in languages]
        out: dict[int, Any] = {}
        for r in sorted({self.scorer.located[i][0] for i in wanted}):
            idx = [i for i in wanted if self.scorer.located[i][0] == r]
            idx.sort(key=lambda i: len(self.scorer.trajectory(i).token_ids))
            for s in range(0, len(idx), batch):
                chunk = idx[s:s + batch]
                trajs = [self.scorer.trajectory(i) for i in chunk]
                for i, t, a in zip(chunk, trajs, chain_lengths(draft, trajs, K), strict=True):
                    out[i] = replay(t, a, K, self.max_new_tokens)
        del draft
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return out

    def records(self, name: str, model: Any, meta: dict[str, Any], languages: list[str] | None = None) -> list[dict]:
        """Registry-style rows (draft x language x subset) for ``model``, with ``meta`` merged into each."""
        from dataclasses import asdict

        from polyspec.training.eval_api import figures

        details = self.score(model, languages)
        rows = []
        for lang in languages or self.languages:
            answers = []
            for i, a in enumerate(self.answers):
                if a.language == lang and i in details:
                    answers.append(type(a)(a.item, a.language, a.shape, {name: details[i]}))
            for row in figures(name, lang, answers, K):
                d = asdict(row)
                rows.append({"draft": name, "language": lang, "subset": d["subset"], "k": K,
                             "positions": [round(x, 4) for x in d["acceptance"]],
                             "mean_acceptance_length": None if d["mean_acceptance_length"] is None
                             else round(d["mean_acceptance_length"], 4),
                             "histogram": d["histogram"], "n_prompts": d["num_prompts"], "num_answers": d["num_answers"],
                             "degenerate_share": round(d["degenerate_share"], 4), "num_tokens": d["num_tokens"],
                             "method": "offline", "benchmark": BENCHMARK, **meta})
        return rows


def mal_of(records: list[dict], draft: str, language: str, subset: str = "all") -> float:
    for r in records:
        if r["draft"] == draft and r["language"] == language and r["subset"] == subset:
            return r["mean_acceptance_length"] or 0.0
    return 0.0


def answer_pool(model: Any, tokenizer: Any, pool: list[dict], decodings: list[Any], budget_s: float,
                max_new_tokens: int, max_prompt_tokens: int, chunk_rows: int) -> tuple[list[dict], dict[str, Any]]:
    """Answer pool prompts in order, every decoding on the same prompts, until ``budget_s`` is spent (at least
    one batch is answered).

    Each batch of prompts is answered by every decoding before the next batch starts, so that a short budget
    still gives every decoding the same prompts (the first GPU run answered whole chunks greedily first, and
    the small per-language budgets ran out before any sampled answer). Rows are training.answers rows plus
    ``decoding``, ``sample``, provenance fields and a ``degenerate`` flag.
    """
    from polyspec.training.answers import template_prompt

    t0, rows, pos, too_long, answered = time.time(), [], 0, 0, 0
    gen_seconds: Counter[str] = Counter()
    gen_tokens: Counter[str] = Counter()
    per_batch = max(1, chunk_rows // max(d.samples for d in decodings))
    per_chunk = 4 * per_batch  # several batches per chunk, sorted by prompt length: little padding per batch
    while pos < len(pool) and (not rows or time.time() - t0 < budget_s):
        recs = pool[pos:pos + per_chunk]
        pos += len(recs)
        templ = []
        for rec in recs:
            ids = template_prompt(tokenizer, [{"role": "user", "content": rec["prompt"]}])
            if len(ids) > max_prompt_tokens:
                too_long += 1
                continue
            templ.append((rec, ids))
        templ.sort(key=lambda rp: len(rp[1]))
        b = 0
        while b < len(templ):
            spent = time.time() - t0
            if rows and spent >= budget_s:
                break
            # a batch no larger than what the time left answers at the rate so far: 4096-prompt batches
            # take 60-90 s on the H200 and would overrun 20-30 s budgets three times over
            rate = answered / sum(gen_seconds.values()) if answered else 0.0
            size = per_batch if not rate else max(32, min(per_batch, int(rate * (budget_s - spent))))
            if rows and size == 32 and rate * (budget_s - spent) < 16:
                break  # less than half of the smallest batch fits
            for d in decodings:
                t1 = time.time()
                new = _answer_batch(model, tokenizer, templ[b:b + size], max_new_tokens, d)
                gen_seconds[d.name] += time.time() - t1
                gen_tokens[d.name] += sum(r["num_answer_tokens"] for r in new)
                rows += new
            answered += len(templ[b:b + size])
            b += size
    stats: dict[str, Any] = {"prompts_taken": pos, "prompts_answered": len({r["id"] for r in rows}),
                             "prompts_too_long": too_long, "pool_size": len(pool),
                             "seconds": round(time.time() - t0, 1), "decodings": {}}
    for d in decodings:
        mine = [r for r in rows if r["decoding"] == d.name]
        dropped = sum(r["degenerate"] for r in mine)
        stats["decodings"][d.name] = {
            "settings": d.to_json(), "answers": len(mine), "degenerate_dropped": dropped,
            "degenerate_share": round(dropped / len(mine), 4) if mine else None,
            "finished": sum(r["finished"] for r in mine), "answer_tokens": gen_tokens[d.name],
            "seconds": round(gen_seconds[d.name], 1),
            "tokens_per_s": round(gen_tokens[d.name] / gen_seconds[d.name]) if gen_seconds[d.name] else None}
    return rows, stats


def _answer_batch(model: Any, tokenizer: Any, batch: list[tuple[dict, list[int]]], max_new_tokens: int,
                  decoding: Any) -> list[dict]:
    from polyspec.models.degenerate import is_degenerate
    from polyspec.training.answers import answer_tokens, cut_answer, eos_ids, make_row

    eos = eos_ids(tokenizer, model.generation_config)
    rows = []
    outs = _generate_halving(model, tokenizer, [p for _, p in batch], max_new_tokens, decoding)
    for (rec, p), samples in zip(batch, outs, strict=True):
        for s, gen in enumerate(samples):
            ans, fin = cut_answer(gen, eos)
            row = make_row(rec, p, ans, fin, "")
            row.update(decoding=decoding.name, sample=s, source=rec.get("source"), license=rec.get("license"),
                       weight=rec.get("weight"), file=rec.get("file"))
            row["degenerate"] = is_degenerate(answer_tokens(row))
            rows.append(row)
    return rows


def _generate_halving(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                      decoding: Any) -> list[list[list[int]]]:
    """training.decoding.generate, the batch halved on CUDA out-of-memory: large batches are what make the
    answers fast, and one batch too many must not cost the whole phase."""
    import torch

    from polyspec.training.decoding import generate

    try:
        return generate(model, tokenizer, prompts, max_new_tokens, decoding)
    except torch.cuda.OutOfMemoryError:
        if len(prompts) == 1:
            raise
    # retried outside the except block, so that the failed attempt's tensors (held by the traceback) are freed
    torch.cuda.empty_cache()
    log(f"out of memory at {len(prompts)} prompts x {decoding.samples} ({decoding.name}): halving the batch")
    half = len(prompts) // 2
    return (_generate_halving(model, tokenizer, prompts[:half], max_new_tokens, decoding)
            + _generate_halving(model, tokenizer, prompts[half:], max_new_tokens, decoding))


def examples(tokenizer: Any, rows: list[dict], n: int = 2) -> list[dict[str, Any]]:
    """A few answers per (decoding, degenerate) for the report: what the filter keeps and drops."""
    from polyspec.training.answers import answer_tokens

    out, seen = [], Counter()
    for r in rows:
        key = (r["decoding"], r["degenerate"])
        if seen[key] < n:
            seen[key] += 1
            out.append({"id": r["id"], "decoding": r["decoding"], "degenerate": r["degenerate"],
                        "text": tokenizer.decode(answer_tokens(r), skip_special_tokens=True)[:600]})
    return out


def export_draft(draft_dir: Path, transport: Path, name: str, keep_head: bool = False) -> dict[str, Any]:
    """The draft's files for the trip back: config.json and its weights without ``lm_head.weight`` (the
    verifier's rows picked by t2d, rebuilt on arrival; kept when the two verifiers differ), with hashes of
    every tensor and of the full file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    full = draft_dir / "model.safetensors"
    tensors, hashes = {}, {}
    with safe_open(str(full), "pt") as fh:
        meta = fh.metadata()
        for key in fh.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
            t = fh.get_tensor(key)
            hashes[key] = tensor_sha256(t)
            if keep_head or key != "lm_head.weight":
                tensors[key] = t
    out = transport / name
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "weights.safetensors"), metadata=meta)
    (out / "config.json").write_bytes((draft_dir / "config.json").read_bytes())
    manifest = {"name": name, "model.safetensors": {"bytes": full.stat().st_size, "sha256": file_sha256(full)},
                "config.json": {"sha256": file_sha256(draft_dir / "config.json")}, "tensors": hashes,
                "metadata": meta, "stripped": [] if keep_head else ["lm_head.weight"]}
    atomic_write_json(out / "manifest.json", manifest, indent=1)
    (transport / f"{name}.done").write_text("ok\n")
    return manifest


def tensor_sha256(t: Any) -> str:
    """sha256 of a tensor's raw bytes (dtype and layout as stored)."""
    import torch

    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pooled(records: list[dict], draft: str, languages: list[str], subset: str) -> float | None:
    """MAL pooled over several languages' histograms (the headline across languages)."""
    hists = [r["histogram"] for r in records if r["draft"] == draft and r["language"] in languages and r["subset"] == subset]
    return mal_from_histogram(merge_histograms(hists)) if hists else None


def write_json(path: Path, data: Any) -> None:
    atomic_write_json(path, data, indent=None)


def read_pool(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows[:limit] if limit else rows
