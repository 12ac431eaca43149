"""Acceptance tables, plots and docs/results/acceptance.json, regenerated from the registry.

    .venv/bin/python bench/acceptance.py                      # the registry of POLYSPEC_REGISTRY_URL
    .venv/bin/python bench/acceptance.py --from-shipped       # a fresh registry holding models/drafts/
    .venv/bin/python bench/acceptance.py --registry sqlite:///path.db --out DIR

Every evaluation recorded for a draft becomes one record of the contract in docs/results.md:
{"draft", "role", "target_language", "language", "k", "positions", "mean_acceptance_length",
"n_prompts", "method"} (live router figures are left out: they are not a benchmark).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=160)
LANG_ORDER = ["en", "fr", "de", "es", "it", "ru", "zh", "ja", "ko"]


class NoEvaluations(RuntimeError):
    """The registry holds no benchmark evaluation to report."""


def draft_role(draft: Any) -> str:
    """base | finetuned | from-scratch, from the draft's recorded recipe and parent."""
    recorded = (draft.provenance or {}).get("role")
    if recorded in ("base", "finetuned", "from-scratch"):
        return recorded
    if draft.parent:
        return "finetuned"
    mode = ((draft.provenance or {}).get("recipe") or {}).get("mode", "")
    return "from-scratch" if mode == "from-scratch-custom-vocab" or draft.languages != ["en"] else "base"


def records_from_registry(reg: Any) -> list[dict[str, Any]]:
    """The contract records, one per (draft, language, method, benchmark) evaluation."""
    out = []
    for draft in reg.drafts():
        for ev in reg.evaluations(draft=draft.ref):
            if ev.method == "live":
                continue
            out.append({
                "draft": draft.ref,
                "role": draft_role(draft),
                "target_language": draft.languages[0] if len(draft.languages) == 1 else None,
                "language": ev.language,
                "k": ev.k,
                "positions": [round(p, 4) for p in ev.acceptance],
                "mean_acceptance_length": round(ev.mean_acceptance_length, 4),
                "n_prompts": ev.num_prompts,
                "method": ev.method,
                "benchmark": ev.benchmark,
            })
    if not out:
        raise NoEvaluations("the registry holds no evaluation: import or train a draft first (--from-shipped)")
    order = {lang: i for i, lang in enumerate(LANG_ORDER)}
    return sorted(out, key=lambda r: (r["draft"], r["method"], order.get(r["language"], 99), r["language"]))


def shipped_registry(workdir: Path) -> str:
    """A fresh SQLite registry holding the drafts of models/drafts/ with their recorded evaluations."""
    from models.shipped import shipped_drafts
    from polyspec.demo import install_shipped
    from registry import open_registry

    url = f"sqlite:///{workdir / 'acceptance.db'}"
    quiet = Console(quiet=True)
    with open_registry(url) as reg:
        for shipped in shipped_drafts():
            reg.ensure_verifier(shipped.verifier)
            install_shipped(reg, shipped, quiet)
    return url


def print_tables(records: list[dict[str, Any]]) -> None:
    drafts = list(dict.fromkeys(r["draft"] for r in records))
    langs = [lang for lang in LANG_ORDER if any(r["language"] == lang for r in records)]
    langs += sorted({r["language"] for r in records} - set(langs))
    table = Table(title="mean acceptance length, k=3 (1 + sum of per-position acceptance)")
    table.add_column("draft")
    table.add_column("role")
    table.add_column("method")
    for lang in langs:
        table.add_column(lang, justify="right")
    for draft in drafts:
        for method in sorted({r["method"] for r in records if r["draft"] == draft}):
            cells = {r["language"]: r for r in records if r["draft"] == draft and r["method"] == method}
            role = next(r["role"] for r in records if r["draft"] == draft)
            table.add_row(draft, role, method, *(f"{cells[lang]['mean_acceptance_length']:.3f}" if lang in cells else "-"
                                                  for lang in langs))
    console.print(table)
    pos = Table(title="acceptance at positions 1 / 2 / 3")
    for col in ("draft", "method", "language", "n", "p1", "p2", "p3", "MAL"):
        pos.add_column(col, justify="left" if col in ("draft", "method", "language") else "right")
    for r in records:
        pos.add_row(r["draft"], r["method"], r["language"], str(r["n_prompts"]),
                    *(f"{p:.3f}" for p in r["positions"]), f"{r['mean_acceptance_length']:.3f}")
    console.print(pos)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Acceptance per position, one panel per language, one bar group per draft."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = [lang for lang in LANG_ORDER if any(r["language"] == lang for r in records)]
    drafts = list(dict.fromkeys(r["draft"] for r in records))
    fig, axes = plt.subplots(1, len(langs), figsize=(2.3 * len(langs), 3.2), sharey=True, squeeze=False)
    width = 0.8 / max(1, len(drafts))
    for ax, lang in zip(axes[0], langs, strict=True):
        for j, draft in enumerate(drafts):
            row = next((r for r in records if r["draft"] == draft and r["language"] == lang and r["method"] == "vllm"),
                       next((r for r in records if r["draft"] == draft and r["language"] == lang), None))
            if row is None:
                continue
            xs = [i + j * width for i in range(len(row["positions"]))]
            ax.bar(xs, row["positions"], width=width, label=draft if lang == langs[0] else None)
        ax.set_title(f"{lang}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(3)], ["p1", "p2", "p3"])
    axes[0][0].set_ylabel("P(at least i drafts accepted)")
    fig.legend(loc="lower center", ncol=max(1, len(drafts)), fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    registry: Optional[str] = typer.Option(None, help="Registry URL (default: POLYSPEC_REGISTRY_URL / settings)."),
    from_shipped: bool = typer.Option(False, "--from-shipped", help="Use a fresh registry holding models/drafts/."),
    out: Path = typer.Option(ROOT / "docs" / "results", help="Where acceptance.json and the plot go."),
) -> None:
    """Print the acceptance tables and write acceptance.json and acceptance_positions.png."""
    from registry import open_registry

    with tempfile.TemporaryDirectory() as tmp:
        url = shipped_registry(Path(tmp)) if from_shipped else registry
        try:
            with open_registry(url) as reg:
                records = records_from_registry(reg)
        except NoEvaluations as exc:
            console.print(f"[red]{exc}")
            raise typer.Exit(1) from None
    print_tables(records)
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    plot(records, out / "acceptance_positions.png")
    console.print(f"wrote {out / 'acceptance.json'} ({len(records)} records) and {out / 'acceptance_positions.png'}")


if __name__ == "__main__":
    typer.run(main)
