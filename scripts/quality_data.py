"""CPU side of scripts/quality_gpu.py: what travels to the GPU machine and what comes back.

    python scripts/quality_data.py pools OUT [--data ../shared/data]   # weighted prompt pools, one per language
    python scripts/quality_data.py tokenizer OUT                        # the verifier's tokenizer files + config
    python scripts/quality_data.py tiny TOKDIR OUT                      # a tiny random verifier (smoke runs)
    python scripts/quality_data.py strip DRAFT_DIR OUT                  # a draft without lm_head (to carry it)
    python scripts/quality_data.py restore TRANSPORT_DIR OUT --verifier V   # rebuild lm_head, check every hash

Pools: every prompt of the language's pack files (train/LANG.jsonl, train/more/LANG.jsonl.gz, and for English
train/en_sharegpt.jsonl, licence "unclear (ShareGPT)", kept as the README asks), checked with core.langid
(the identifier the router uses), in weighted random order (training.prompt_pool). A draft's provenance is
counted from the prompts it was trained on, on the GPU machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_write_json

LANGS = ("en", "it", "ko", "zh", "ja", "fr", "de", "es", "ru")  # ru: answers for the multilingual draft
MIN_CONFIDENCE = 0.3  # training.config.PromptsConfig's default
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json", "generation_config.json")


def pack_files(data: Path, lang: str) -> list[Path]:
    files = [data / "train" / f"{lang}.jsonl", data / "train" / "more" / f"{lang}.jsonl.gz"]
    if lang == "en":
        files.append(data / "train" / "en_sharegpt.jsonl")
    return [f for f in files if f.is_file()]


def build_pool(data: Path, lang: str, seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from polyspec.core.langid import detect_many
    from polyspec.training.prompt_pool import provenance, read_pack_file, weighted_order
    from polyspec.training.prompts import _dedupe  # noqa: PLC2701 - the pipeline's own de-duplication, same key

    records = [{**r, "text": r["prompt"]} for f in pack_files(data, lang) for r in read_pack_file(f)]
    unique = _dedupe(records, set())
    guesses = detect_many([r["prompt"] for r in unique])
    kept = [r for r, g in zip(unique, guesses, strict=True) if g.language == lang and g.confidence >= MIN_CONFIDENCE]
    pool = weighted_order(kept, seed)
    keep = ("id", "lang", "domain", "prompt", "source", "license", "file", "weight")
    pool = [{k: r.get(k) for k in keep} for r in pool]
    stats = {"files": [str(f.relative_to(data)) for f in pack_files(data, lang)], "read": len(records),
             "duplicates": len(records) - len(unique), "other_language": len(unique) - len(kept),
             "pool": len(pool), "provenance": provenance(pool)}
    return pool, stats


def cmd_pools(out: Path, data: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for lang in LANGS:
        pool, stats = build_pool(data, lang)
        with gzip.open(out / f"{lang}.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in pool)
        summary[lang] = stats
        print(f"{lang}: {stats['pool']} prompts ({stats['other_language']} other-language, {stats['duplicates']} duplicates)")
    atomic_write_json(out / "pools.json", summary, indent=1)


def cmd_tokenizer(out: Path) -> None:
    from polyspec.models.verifiers import prepare_verifier

    src = Path(prepare_verifier().path)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)


def cmd_tiny(tokdir: Path, out: Path) -> None:
    """A random 8-layer, 64-wide model with the verifier's tokenizer, vocabulary and chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads((tokdir / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16)
    cfg.pop("quantization_config", None)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if name != "config.json" and (tokdir / name).is_file():
            shutil.copy2(tokdir / name, out / name)


def cmd_strip(draft: Path, out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    with safe_open(str(draft / "model.safetensors"), "pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys() if k != "lm_head.weight"}  # noqa: SIM118
    save_file(tensors, str(out / "model.safetensors"), metadata=meta)
    shutil.copy2(draft / "config.json", out / "config.json")


def cmd_restore(transport: Path, out: Path, verifier: str) -> None:
    """Each transport/NAME (weights.safetensors without lm_head, manifest.json) -> OUT/NAME/model.safetensors,
    lm_head rebuilt from the verifier; every tensor hash, and the whole file's, checked against the manifest."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quality_lib import file_sha256, tensor_sha256

    from polyspec.models.draft_build import verifier_lm_head_weight

    head = verifier_lm_head_weight(verifier).to(torch.bfloat16)
    report = {}
    for src in sorted(p for p in transport.iterdir() if (p / "manifest.json").is_file()):
        manifest = json.loads((src / "manifest.json").read_text())
        with safe_open(str(src / "weights.safetensors"), "pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
        if "lm_head.weight" not in tensors:
            tensors["lm_head.weight"] = head[tensors["t2d"].bool()].contiguous()
        bad = [k for k, h in manifest["tensors"].items() if k not in tensors or tensor_sha256(tensors[k]) != h]
        dst = out / src.name
        dst.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(dst / "model.safetensors"), metadata=manifest["metadata"])
        shutil.copy2(src / "config.json", dst / "config.json")
        same_file = file_sha256(dst / "model.safetensors") == manifest["model.safetensors"]["sha256"]
        report[src.name] = {"tensors_differing": bad, "byte_identical": same_file,
                            "sha256": file_sha256(dst / "model.safetensors"),
                            "bytes": (dst / "model.safetensors").stat().st_size}
        print(f"{src.name}: {'OK' if not bad else 'MISMATCH ' + str(bad)}, byte-identical file: {same_file}")
    atomic_write_json(out / "restore.json", report, indent=1)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pools")
    p.add_argument("out", type=Path)
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    sub.add_parser("tokenizer").add_argument("out", type=Path)
    t = sub.add_parser("tiny")
    t.add_argument("tokdir", type=Path)
    t.add_argument("out", type=Path)
    s = sub.add_parser("strip")
    s.add_argument("draft", type=Path)
    s.add_argument("out", type=Path)
    r = sub.add_parser("restore")
    r.add_argument("transport", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--verifier", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "pools":
        cmd_pools(args.out, args.data)
    elif args.cmd == "tokenizer":
        cmd_tokenizer(args.out)
    elif args.cmd == "tiny":
        cmd_tiny(args.tokdir, args.out)
    elif args.cmd == "strip":
        cmd_strip(args.draft, args.out)
    else:
        cmd_restore(args.transport, args.out, args.verifier)


if __name__ == "__main__":
    main(sys.argv[1:])
