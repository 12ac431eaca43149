"""Acceptance tables, plots and docs/results/acceptance.json, regenerated from the registry.

    .venv/bin/python bench/acceptance.py                      # the registry of POLYSPEC_REGISTRY_URL
    .venv/bin/python bench/acceptance.py --from-shipped       # a fresh registry holding models/drafts/
    .venv/bin/python bench/acceptance.py --registry sqlite:///path.db --out DIR
    .venv/bin/python bench/acceptance.py --from-shipped --results docs/results/registry.json --readme README.md

Every evaluation recorded for a draft becomes one record of the contract in docs/results.md:
{"draft", "role", "target_language", "language", "k", "positions", "mean_acceptance_length",
"n_prompts", "method", "subset", "degenerate_share", "shipped"} (live router figures are left out: they are not a
benchmark). ``target_language`` is for display: the one language a draft is made for alone, None for a draft
made for several (which languages a draft is for is the registry's ``languages``). ``subset`` is "all" or "non_degenerate" (answers without repetition loops, `polyspec eval`).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from polyspec.core.atomic import atomic_write_json, atomic_write_text  # noqa: E402
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
    if recorded in ("base", "finetuned", "from-scratch", "multilingual"):
        return recorded
    if draft.parent:
        return "finetuned"
    mode = ((draft.provenance or {}).get("recipe") or {}).get("mode", "")
    return "from-scratch" if mode == "from-scratch-custom-vocab" or draft.languages != ["en"] else "base"


def shipped_keys() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(name, checksums) of the drafts the checkout ships in models/drafts/ (its manifest)."""
    from polyspec.models.shipped import checkout_drafts

    return {(d.name, tuple(sorted(d.checksums.items()))) for d in checkout_drafts()}


def records_from_registry(reg: Any) -> list[dict[str, Any]]:
    """The contract records, one per (draft, language, method, benchmark, subset) evaluation; ``shipped`` says
    whether the draft is the one models/drafts/ ships at this commit (same name and checksums)."""
    out = []
    shipped = shipped_keys()
    for draft in reg.drafts():
        is_shipped = (draft.name, tuple(sorted((draft.checksums or {}).items()))) in shipped
        for ev in reg.evaluations(draft=draft.ref):
            if ev.method == "live":
                continue
            out.append({
                "draft": draft.ref,
                "role": draft_role(draft),
                # for display: the one language a draft is made for alone; None for a draft made for several
                "target_language": draft.languages[0] if len(draft.languages) == 1 else None,
                "language": ev.language,
                "k": ev.k,
                "positions": [round(p, 4) for p in ev.acceptance],
                "mean_acceptance_length": round(ev.mean_acceptance_length, 4),
                "n_prompts": ev.num_prompts,
                "method": ev.method,
                "benchmark": ev.benchmark,
                "subset": ev.subset,
                "degenerate_share": ev.degenerate_share,
                "shipped": is_shipped,
            })
    if not out:
        raise NoEvaluations("the registry holds no evaluation: import or train a draft first (--from-shipped)")
    order = {lang: i for i, lang in enumerate(LANG_ORDER)}
    return sorted(out, key=lambda r: (r["draft"], r["method"], r["subset"] != "all", order.get(r["language"], 99),
                                      r["language"]))


def shipped_registry(workdir: Path) -> str:
    """A fresh SQLite registry holding the drafts of models/drafts/ with their recorded evaluations."""
    from polyspec.models.shipped import shipped_drafts
    from polyspec.demo import install_shipped
    from polyspec.registry import open_registry

    url = f"sqlite:///{workdir / 'acceptance.db'}"
    quiet = Console(quiet=True)
    with open_registry(url) as reg:
        for shipped in shipped_drafts():
            reg.ensure_verifier(shipped.verifier)
            install_shipped(reg, shipped, quiet)
    return url


def merge_results(reg: Any, path: Path) -> int:
    """Merge a registry export of results (docs/results/registry.json) into ``reg``; returns evaluations added.

    The export names the verifier by its name, so it joins the verifier registered here whatever its local
    path; evaluations already recorded (same draft, benchmark, language, k and method) are not doubled.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    here = {v.name: v for v in reg.verifiers()}
    data["verifiers"] = [{**v, "location": here[v["name"]].location} if v["name"] in here else v
                         for v in data.get("verifiers", [])]
    have = {(e.draft, e.benchmark, e.language, e.k, e.method, e.subset) for e in reg.evaluations()}
    data["evaluations"] = [e for e in data.get("evaluations", [])
                           if (e["draft"], e["benchmark"], e["language"], e["k"], e["method"], e.get("subset", "all"))
                           not in have]
    return reg.import_json(data)["evaluations"]


def primary_benchmark(records: list[dict[str, Any]]) -> str:
    """The benchmark with the most prompts per record: the one the plot and position table show."""
    return max({r["benchmark"] for r in records}, key=lambda b: max(r["n_prompts"] for r in records if r["benchmark"] == b))


def _languages(records: list[dict[str, Any]]) -> list[str]:
    langs = [lang for lang in LANG_ORDER if any(r["language"] == lang for r in records)]
    return langs + sorted({r["language"] for r in records} - set(langs))


def mal_rows(records: list[dict[str, Any]], benchmark: str) -> tuple[list[str], list[list[str]]]:
    """(languages, rows of [draft, role, method, MAL per language]) of one benchmark."""
    recs = [r for r in records if r["benchmark"] == benchmark]
    langs = _languages(recs)
    rows = []
    for draft in dict.fromkeys(r["draft"] for r in recs):
        for method, subset in sorted({(r["method"], r["subset"]) for r in recs if r["draft"] == draft},
                                     key=lambda ms: (ms[0], ms[1] != "all")):
            cells = {r["language"]: r for r in recs
                     if r["draft"] == draft and r["method"] == method and r["subset"] == subset}
            role = next(iter(cells.values()))["role"]
            label = method if subset == "all" else f"{method}, {subset}"
            rows.append([draft, role, label, *(f"{cells[lang]['mean_acceptance_length']:.3f}" if lang in cells else "-"
                                                for lang in langs)])
    return langs, rows


def print_tables(records: list[dict[str, Any]]) -> None:
    for benchmark in sorted({r["benchmark"] for r in records}):
        langs, rows = mal_rows(records, benchmark)
        table = Table(title=f"{benchmark}: mean acceptance length, k=3 (1 + sum of per-position acceptance)")
        for col in ("draft", "role", "method", *langs):
            table.add_column(col, justify="left" if col in ("draft", "role", "method") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    primary = primary_benchmark(records)
    pos = Table(title=f"{primary}: acceptance at positions 1 / 2 / 3")
    for col in ("draft", "method", "language", "n", "p1", "p2", "p3", "MAL"):
        pos.add_column(col, justify="left" if col in ("draft", "method", "language") else "right")
    for r in records:
        if r["benchmark"] == primary and r["subset"] == "all":
            pos.add_row(r["draft"], r["method"], r["language"], str(r["n_prompts"]),
                        *(f"{p:.3f}" for p in r["positions"]), f"{r['mean_acceptance_length']:.3f}")
    console.print(pos)


def markdown(records: list[dict[str, Any]]) -> str:
    """The mean-acceptance-length tables of every benchmark, as Markdown (docs/results/acceptance_tables.md)."""
    parts = ["<!-- generated by bench/acceptance.py; do not edit -->"]
    for benchmark in sorted({r["benchmark"] for r in records}):
        langs, rows = mal_rows(records, benchmark)
        n = max(r["n_prompts"] for r in records if r["benchmark"] == benchmark)
        parts.append(f"\n### {benchmark} (up to {n} prompts per language)\n")
        parts.append("| draft | role | method | " + " | ".join(langs) + " |")
        parts.append("|---|---|---|" + "---:|" * len(langs))
        parts += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(parts) + "\n"


HEADLINE_BEGIN = "<!-- headline table: generated by bench/acceptance.py --readme README.md; do not edit until the end mark -->"
HEADLINE_END = "<!-- end of headline table -->"
MADE = {"base": "from scratch, 8k vocabulary (the base)", "finetuned": "fine-tune of the base, 1:1 English replay",
        "from-scratch": "from scratch, own 8k vocabulary",
        "multilingual": "the multilingual draft: 18 languages, warm start from the base, merged 12k vocabulary"}


def headline(records: list[dict[str, Any]]) -> str:
    """The README's table: per language, the shipped English base, the language's shipped draft and, when one
    ships, the multilingual draft, over all answers and over non-degenerate ones, on the primary benchmark."""
    primary = primary_benchmark(records)
    recs = [r for r in records if r["shipped"] and r["benchmark"] == primary and r["method"] == "offline"]
    mal = {(r["draft"], r["language"], r["subset"]): r["mean_acceptance_length"] for r in recs}
    base = next((r["draft"] for r in recs if r["role"] == "base"), None)
    multi = next((r["draft"] for r in recs if r["role"] == "multilingual"), None)
    own = {r["target_language"]: r for r in recs if r["role"] != "base" and r["target_language"]}
    for r in recs:  # the multilingual draft stands in where no draft ships for that language alone
        if r["draft"] == multi and r["language"] != "en":
            own.setdefault(r["language"], r)

    def pair(draft: str | None, lang: str) -> str:
        vals = [mal.get((draft, lang, subset)) for subset in ("all", "non_degenerate")]
        return " / ".join("–" if v is None else f"{v:.3f}" for v in vals)

    extra = (" multilingual draft |", "---:|") if multi else ("", "")
    lines = ["| language | English base draft | its own shipped draft | English through it |" + extra[0]
             + " how the draft was made |", "|---|---:|---:|---:|" + extra[1] + "---|"]
    for lang in [x for x in LANG_ORDER if x in own or x == "en"]:
        more = f" {pair(multi, lang)} |" if multi else ""
        if lang == "en":
            lines.append(f"| en | {pair(base, 'en')} | — | — |{more} {MADE['base']} |")
            continue
        draft = own[lang]["draft"]
        lines.append(f"| {lang} | {pair(base, lang)} | **{pair(draft, lang)}** | {pair(draft, 'en')} |{more} "
                     f"{MADE.get(own[lang]['role'], own[lang]['role'])} |")
    return "\n".join([HEADLINE_BEGIN, "", *lines, "", HEADLINE_END]) + "\n"


def splice(page: Path, block: str) -> None:
    """Replace the headline block of ``page`` (both marks must be there: a page is never rewritten blind)."""
    text = page.read_text(encoding="utf-8")
    begin, end = text.find(HEADLINE_BEGIN), text.find(HEADLINE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{page} has no headline marks ({HEADLINE_BEGIN!r} ... {HEADLINE_END!r})")
    atomic_write_text(page, text[:begin] + block.rstrip("\n") + text[end + len(HEADLINE_END):])


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Before and after: per language, the base draft and the drafts made for that language, per position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    primary = primary_benchmark(records)
    recs = [r for r in records if r["benchmark"] == primary and r["subset"] == "all"]
    langs = [lang for lang in LANG_ORDER if any(r["language"] == lang for r in recs)]
    cols = min(3, len(langs))
    rows = -(-len(langs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), sharey=True, squeeze=False)
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]  # grey is the base's
    for ax, lang in zip(axes.flat, langs):
        shown = sorted((r for r in recs if r["language"] == lang and (r["role"] in ("base", "multilingual") or r["target_language"] == lang)),
                       key=lambda r: (r["role"] != "base", r["draft"]))
        width = 0.8 / max(1, len(shown))
        for j, row in enumerate(shown):
            xs = [i + j * width for i in range(len(row["positions"]))]
            label = row["draft"].split("instruct-")[-1] + f"  {row['mean_acceptance_length']:.2f}"
            color = "grey" if row["role"] == "base" else palette[(j - 1) % len(palette)]
            ax.bar(xs, row["positions"], width=width, label=label, color=color)
        ax.set_title(lang)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(3)], ["p1", "p2", "p3"])
        ax.legend(fontsize=6, loc="upper right")
    for ax in list(axes.flat)[len(langs):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("P(at least i accepted)")
    fig.suptitle(f"{primary}: base draft (grey) and the drafts made for each language; legend = MAL", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    registry: Optional[str] = typer.Option(None, help="Registry URL (default: POLYSPEC_REGISTRY_URL / settings)."),
    from_shipped: bool = typer.Option(False, "--from-shipped", help="Use a fresh registry holding models/drafts/."),
    results: list[Path] = typer.Option([], "--results", help="Merge a registry export of results first "
                                       "(docs/results/registry.json: every draft of the founding experiment)."),
    out: Path = typer.Option(ROOT / "docs" / "results", help="Where acceptance.json and the plot go."),
    readme: Optional[Path] = typer.Option(None, help="Also replace this page's headline table (README.md)."),
) -> None:
    """Print the acceptance tables and write acceptance.json, acceptance_tables.md and acceptance_positions.png."""
    from polyspec.registry import open_registry
    from polyspec.registry.errors import RegistryError

    missing = [str(p) for p in results if not p.is_file()]
    if missing:
        console.print(f"[red]no such results file: {', '.join(missing)}")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        url = shipped_registry(Path(tmp)) if from_shipped else registry
        try:
            with open_registry(url) as reg:
                for path in results:
                    console.print(f"merged {path}: {merge_results(reg, path)} evaluations")
                records = records_from_registry(reg)
        except NoEvaluations as exc:
            console.print(f"[red]{exc}")
            raise typer.Exit(1) from None
        except (RegistryError, ValueError, KeyError) as exc:
            console.print(f"[red]cannot merge the results: {exc}")
            raise typer.Exit(1) from None
    print_tables(records)
    atomic_write_json(out / "acceptance.json", records, indent=1)
    atomic_write_text(out / "acceptance_tables.md", markdown(records))
    atomic_write_text(out / "acceptance_headline.md", headline(records))
    if readme is not None:
        try:
            splice(readme, headline(records))
        except (OSError, ValueError) as exc:
            console.print(f"[red]cannot update {readme}: {exc}")
            raise typer.Exit(1) from None
    plot(records, out / "acceptance_positions.png")
    console.print(f"wrote {out / 'acceptance.json'} ({len(records)} records), acceptance_tables.md and "
                  f"{out / 'acceptance_positions.png'}")


if __name__ == "__main__":
    typer.run(main)
