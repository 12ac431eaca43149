"""Every check of the docs against committed benchmark and results JSON lives here, in one module: a stale page
fails these tests and no product test (regenerate the page with the command each failure names).

- The published acceptance figures are reproducible: regenerating them from the registry export that docs/
  ships (docs/results/registry.json, every founding draft's evaluations) and the shipped drafts gives exactly
  the committed docs/results/acceptance.json and acceptance_tables.md. So a change to the acceptance
  arithmetic, to the export format or to the table layout that would change a published figure fails here,
  and the fix is to regenerate docs/, never to edit a figure by hand. These assert no figure themselves: the
  registry export is the source.
- Each bench page's tables are bench/report.py's rendering of the committed run (docs/benchmarks/*.json,
  docs/results/*.json), and the capacity and multi-GPU blocks of docs/scale-out.md are their scripts'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "results"
REGENERATE = ".venv/bin/python bench/acceptance.py --from-shipped --results docs/results/registry.json"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory, verifier) -> Path:
    """bench/acceptance.py's output for the shipped drafts plus the committed registry export."""
    out = tmp_path_factory.mktemp("docs-figures")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "acceptance.py"), "--from-shipped",
                           "--results", str(DOCS / "registry.json"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return out


def _key(record: dict) -> tuple:
    return (record["draft"], record.get("benchmark"), record["language"], record["method"], record["k"],
            record.get("subset", "all"))


def test_acceptance_json_matches_the_registry(regenerated: Path) -> None:
    fresh = json.loads((regenerated / "acceptance.json").read_text())
    committed = json.loads((DOCS / "acceptance.json").read_text())
    assert fresh, "the registry export gave no records"
    fresh_by, committed_by = {_key(r): r for r in fresh}, {_key(r): r for r in committed}
    assert len(fresh_by) == len(fresh) and len(committed_by) == len(committed)  # one record per measurement
    hint = f"docs/results/acceptance.json is stale: regenerate it with `{REGENERATE}`"
    assert sorted(fresh_by) == sorted(committed_by), f"{hint} (records added or removed)"
    for key, record in fresh_by.items():
        old = committed_by[key]
        assert set(record) == set(old), f"{hint} (fields of {key})"
        for field, value in record.items():
            if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
                # Rounded to 4 places when written; a last-digit difference is rounding, not a new figure.
                assert value == pytest.approx(old[field], abs=2e-4), f"{hint} ({key} {field})"
            else:
                assert value == old[field], f"{hint} ({key} {field})"
    assert [_key(r) for r in fresh] == [_key(r) for r in committed], f"{hint} (record order)"


def test_acceptance_tables_match_the_registry(regenerated: Path) -> None:
    fresh = (regenerated / "acceptance_tables.md").read_text()
    assert fresh == (DOCS / "acceptance_tables.md").read_text(), \
        f"docs/results/acceptance_tables.md is stale: regenerate it with `{REGENERATE}`"


def test_acceptance_plot_is_drawn(regenerated: Path) -> None:
    # The PNG is not compared byte for byte (matplotlib and font versions move pixels); that it is drawn
    # from the same records is what the two tests above establish.
    png = regenerated / "acceptance_positions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_readme_headline_matches_the_registry(regenerated: Path) -> None:
    fresh = (regenerated / "acceptance_headline.md").read_text().strip()
    readme = (ROOT / "README.md").read_text()
    begin = readme.index(fresh.splitlines()[0])
    end = readme.index("<!-- end of headline table -->", begin) + len("<!-- end of headline table -->")
    assert readme[begin:end] == fresh, \
        f"README.md's headline table is stale: regenerate it with `{REGENERATE} --readme README.md`"


def test_multilingual_comparison_matches_its_records(tmp_path: Path) -> None:
    """docs/results.md §14 (the nine-language draft against the specialists) is scripts/multi_report.py's
    rendering of the committed run records and CPU check; the shipped multilingual draft is the one §16 measured
    (the product's 18-language run, docs/results/multilingual-warm.json)."""
    args = ["--multi", "docs/results/quality16d.json", "--specialists", "docs/results/quality16c.json",
            "--cpu", "docs/results/multi_cpu_check.json"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "multi_report.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() in (ROOT / "docs" / "results.md").read_text(), (
        f"docs/results.md §14 is stale: regenerate it with `python scripts/multi_report.py {' '.join(args)} "
        "--results-md docs/results.md`")
    manifest = json.loads((ROOT / "models" / "drafts" / "manifest.json").read_text())
    multi = [d for d in manifest["drafts"] if d["role"] == "multilingual"]
    assert len(multi) == 1 and multi[0]["provenance"]["run"] == "multi18b"
    run = json.loads((DOCS / "multilingual-warm.json").read_text())
    shipped = {(e["benchmark"], e["language"], e["subset"]): e["mean_acceptance_length"]
               for e in multi[0]["evaluations"] if e["method"] == "offline"}  # vLLM rows: scripts/served_acceptance.py
    measured = {("mtbench-160" if bench == "mtbench" else f"{bench}-{cell['answers']}", lang, subset): value
                for bench, per_lang in run["figures"].items() for lang, cell in per_lang.items()
                for subset, value in cell.items() if subset in ("all", "non_degenerate") and value is not None}
    assert shipped.keys() == measured.keys()
    assert all(shipped[k] == pytest.approx(measured[k], abs=1e-3) for k in shipped)


# --- bench pages: each table is bench/report.py's rendering of a committed JSON ---------------------------


def test_adaptation_page_shows_the_recorded_runs() -> None:
    """docs/adaptation.md's table is bench/report.py's rendering of the committed adaptation.json (regenerate
    it with `.venv/bin/python bench/report.py docs/results/adaptation.json`), and a recorded run meets the
    adaptation bar: acceptance and tokens/s up, no failed request."""
    from bench.report import adaptation_md

    root = ROOT
    data = json.loads((root / "docs" / "results" / "adaptation.json").read_text())
    assert adaptation_md(data).strip() in (root / "docs" / "adaptation.md").read_text()
    assert any(r["live_mal_after"] > r["live_mal_before"] and r["live_tps_after"] > r["live_tps_before"]
               and r["failed_requests_during_swap"] == 0 for r in data["runs"])


def test_speed_page_shows_the_recorded_run() -> None:
    """docs/speed.md's table is bench/report.py's rendering of the committed speed_policy.json (regenerate it
    with `.venv/bin/python bench/report.py speed_policy.json`): the run in balanced orders, with its carry-over,
    the engines' step times and its verdict on the speed policy's bar, computed from the figures, met or not."""
    from bench.report import speed_policy_md

    root = ROOT
    data = json.loads((root / "docs" / "benchmarks" / "speed_policy.json").read_text())
    page = (root / "docs" / "speed.md").read_text()
    assert speed_policy_md(data).strip() in page
    assert set(data["languages"]) == {*data["settings"]["drafted"], *data["settings"]["no_draft"]}
    assert data["settings"]["turns"] % 2 == 0 and set(data["carryover"]) == {"speed_after_mal", "mal_after_speed", "apart"}
    assert set(data["engine_steps"]) == {"plain", *data["settings"]["drafted"]}
    # The earlier full runs, which docs/speed.md cites (orders that favoured one policy), are kept as they were.
    for name in ("speed_policy_run1.json", "speed_policy_run2.json"):
        earlier = json.loads((root / "docs" / "benchmarks" / name).read_text())
        assert "carryover" not in earlier and set(earlier["languages"]) >= {"fr", "it"}
    # the balanced run before it (each engine ranked by its own calibration, before engine shapes) is on
    # the page beside it, and the first one is kept
    previous = json.loads((root / "docs" / "benchmarks" / "speed_policy_run5.json").read_text())
    assert "carryover" in previous and speed_policy_md(previous).strip() in page
    assert "shared_step_s" not in json.dumps(previous) and "shared_step_s" in json.dumps(data)
    assert "carryover" in json.loads((root / "docs" / "benchmarks" / "speed_policy_run4.json").read_text())
    # The A/A run (bench/speed_policy.py --aa) is on the page, and what the page says of it holds in its JSON:
    # both routers made the same choices, every interval crosses 1.0, and its carry-over "apart" leans above
    # 1.0 like every balanced A/B run's.
    aa = json.loads((root / "docs" / "benchmarks" / "speed_policy_aa.json").read_text())
    assert aa["settings"]["aa"] and speed_policy_md(aa).strip() in page and "A/A run" in speed_policy_md(aa)
    for r in aa["languages"].values():
        assert r["engines"]["speed_policy"] == r["engines"]["mal_policy"]
        assert r["speed_over_best_other"]["ci95"][0] <= 1.0 <= r["speed_over_best_other"]["ci95"][1]
    balanced = [aa, data, previous, json.loads((root / "docs" / "benchmarks" / "speed_policy_run4.json").read_text())]
    assert all(run["carryover"]["apart"]["ratio"] > 1.0 for run in balanced)
    # a quick run's language with two prompts gets its ratios without intervals, not intervals of zero width
    quick = json.loads(json.dumps(data))
    it = quick["languages"]["it"]
    it.update(ci95=None, speed_over_mal={"ratio": 1.1, "ci95": None, "prompts": 2})
    rendered = speed_policy_md(quick)
    assert "speed / MAL policy 1.100 (no interval: 2 prompts)" in rendered and "(no interval) |" in rendered
    assert "Bar (" in rendered and "A/A run" not in rendered
    quick["settings"]["aa"] = True  # bench/speed_policy.py --aa: both routers ran the speed policy, no bar to judge
    rendered = speed_policy_md(quick)
    assert "A/A run" in rendered and "Bar (" not in rendered


def test_langid_page_shows_the_recorded_run() -> None:
    """docs/benchmarks.md's language-ID tables are bench/report.py's rendering of the committed langid.json
    (regenerate with `.venv/bin/python bench/report.py langid.json`), release path included, and the run
    reports every cut with and without restriction, with texts/s."""
    from bench.langid import CUTS
    from bench.report import langid_md

    root = ROOT
    data = json.loads((root / "docs" / "benchmarks" / "langid.json").read_text())
    assert langid_md(data).strip() in (root / "docs" / "benchmarks.md").read_text()
    for system in data["systems"]:
        for mode in ("unrestricted", "restricted"):
            assert all(data["accuracy"][cut][system][mode]["mean"] > 0 for cut, _ in CUTS)
            assert all(data["texts_per_s"][system][mode][cut] > 0 for cut in [*(c for c, _ in CUTS), "mixed"])
    assert data["texts_per_s"]["release"]["unrestricted"]["mixed"] > 0


def test_router_overhead_page_shows_the_recorded_run() -> None:
    """docs/benchmarks.md's router-overhead tables (with the CPU table against vllm-router and the floor, and the
    router CPU targets) are bench/report.py's rendering of the committed router_overhead.json: regenerate them
    with `bench/report.py router_overhead.json`. The JSON's targets are router_targets' judgement of its cells."""
    from bench.report import overhead_md
    from bench.router_overhead import router_targets

    data = json.loads((ROOT / "docs" / "benchmarks" / "router_overhead.json").read_text())
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert overhead_md(data).strip() in page
    assert "| conc | polyspec | vllm_router | polyspec / vllm_router | floor | polyspec − floor |" in page
    judged = router_targets(data["concurrency"])
    assert {k: data["targets"][k] for k in judged} == judged
    assert not data["quick"] and data["setup"]["policy"] == "speed"
    for key in ("cpu_within_2x_vllm_router", "cpu_over_floor_within_0_2ms", "c256_p50_no_worse_than_vllm_router"):
        assert isinstance(judged[key], bool), key
    assert "`cpu_within_0_4ms`" not in page


def test_router_ab_rule_finds_nothing_in_the_recorded_a_a_run() -> None:
    """The same code against itself (docs/benchmarks/router_ab/aa-null.json): the interval rule must give no
    verdict in any cell, computed from the run's raw per-round CPU, and the stored cells must be the rule's."""
    from bench.report import OUT
    from bench.router_ab import ratio_interval

    for path in sorted((OUT / "router_ab").glob("*.json")):
        data = json.loads(path.read_text())
        for cell in data["cells"]:
            again = ratio_interval(cell["base_cpu_ms"], cell["candidate_cpu_ms"])
            assert (cell["ratio_ci95"], cell["verdict"]) == (again["ratio_ci95"], again["verdict"]), path.name
            if data["label"] == "aa-null":
                assert again["verdict"] == "no difference", cell


def test_router_ab_page_shows_the_recorded_runs() -> None:
    """docs/benchmarks.md's A/B table is bench/report.py's rendering of docs/benchmarks/router_ab/*.json
    (regenerate with `bench/report.py router_ab`)."""
    from bench.report import OUT, router_ab_md

    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert router_ab_md(OUT / "router_ab").strip() in page


def test_router_budget_page_shows_the_recorded_run() -> None:
    """docs/benchmarks.md's budget table is bench/report.py's rendering of router_budget.json
    (regenerate with `bench/report.py router_budget.json`)."""
    from bench.report import router_budget_md

    root = ROOT
    data = json.loads((root / "docs" / "benchmarks" / "router_budget.json").read_text())
    assert set(data["own_work"]) <= set(data["stages"]) and all(s["median_us"] > 0 for s in data["stages"].values())
    assert router_budget_md(data).strip() in (root / "docs" / "benchmarks.md").read_text()


def test_server_floor_page_shows_the_recorded_run() -> None:
    """docs/benchmarks.md's server table is bench/report.py's rendering of server_floor.json (regenerate with
    `bench/report.py server_floor.json`); its verdicts follow the A/B rule on the stored rounds."""
    from bench.report import server_floor_md
    from bench.router_ab import ratio_interval

    root = ROOT
    data = json.loads((root / "docs" / "benchmarks" / "server_floor.json").read_text())
    for cell in data["cells"]:
        for server, stored in cell["vs_uvicorn"].items():
            assert stored == ratio_interval(cell["cpu_ms"][data["base"]], cell["cpu_ms"][server])
    assert server_floor_md(data).strip() in (root / "docs" / "benchmarks.md").read_text()


def test_the_capacity_table_in_the_docs_is_the_generated_one() -> None:
    from bench import capacity

    assert capacity.main(["--check"]) == 0, "regenerate with `.venv/bin/python bench/capacity.py`"
    table = "\n".join(capacity.block())
    assert "requests/s per router core" in table and "per 1,000 requests/s" in table


def test_scale_out_page_holds_the_block_of_the_committed_json() -> None:
    """docs/scale-out.md's multi-GPU block is scripts/multigpu_report.py's rendering of docs/results/multigpu.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("multigpu_report", ROOT / "scripts" / "multigpu_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    data = json.loads((ROOT / "docs" / "results" / "multigpu.json").read_text())
    page = (ROOT / "docs" / "scale-out.md").read_text()
    assert "\n".join(report.block(data)) in page, \
        "docs/scale-out.md's multi-GPU block is stale: python scripts/multigpu_report.py --docs docs/scale-out.md"
    assert {r["gpus"] for r in data["runs"]} == {1} and len(data["runs"]) == 4  # what one H200 could run


# docs/languages.md's language-ID figures are bench/langid_routes.py's rendering of the committed langid.json, and
# that run meets the short-prompt targets: first two words >= 92 % overall and >= 80 % in every language, on
# MT-Bench and on the held-out train sample, with and without a restriction.
LANGID_RUN = ROOT / "docs" / "benchmarks" / "langid.json"


def test_languages_page_shows_the_committed_langid_run() -> None:
    from bench.langid_routes import BEGIN, END, markdown

    page = (ROOT / "docs" / "languages.md").read_text(encoding="utf-8")
    block = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == "\n".join(markdown(json.loads(LANGID_RUN.read_text(encoding="utf-8")))).strip(), (
        "regenerate with: .venv/bin/python bench/langid_routes.py --docs")


def test_the_committed_langid_run_meets_the_short_prompt_targets() -> None:
    data = json.loads(LANGID_RUN.read_text(encoding="utf-8"))
    assert not data["quick"] and data["texts"] == "heldout"
    targets = data["first_two_words_targets"]
    for source in ("mtbench", "more"):
        for mode in ("unrestricted", "restricted"):
            acc = data["first_two_words"][source][mode]["distinct"]
            assert acc["all"] >= targets["overall"], (source, mode, acc["all"])
            assert acc["min"] >= targets["min_language"], (source, mode, acc)
    costs = data["wrong_label_cost"]["languages"]
    assert {"en", "fr", "ja", "zh"} <= set(costs)
    assert all(row[fleet]["tps"] > 0 for row in costs.values() for fleet in ("specialist", "best_draft"))
    micro = data["per_call_us"]
    assert micro["before_ref"] and micro["now"]["restricted"]["2w"] > 0 and micro["before"]["restricted"]["2w"] > 0


def test_fleet_page_shows_the_recorded_run() -> None:
    """docs/benchmarks.md's fleet section is bench/fleet_figures.py's rendering of the committed fleet_plan.json
    (regenerate with `.venv/bin/python bench/fleet_figures.py`), docs/speed.md's paragraph is its `--summary`;
    the run covers the eight languages, the specialists at k = 3 and the planned fleet at the planner's k (or
    the k the run pinned), every fleet answered every prompt, and its verdicts on the
    targets are the ones its figures give."""
    from bench.fleet_figures import fleet_plan_md, fleet_plan_summary, targets

    data = json.loads((ROOT / "docs" / "benchmarks" / "fleet_plan.json").read_text(encoding="utf-8"))
    hint = "regenerate with `.venv/bin/python bench/fleet_figures.py` (and `--summary` for docs/speed.md)"
    assert fleet_plan_md(data).strip() in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"), hint
    assert fleet_plan_summary(data) in (ROOT / "docs" / "speed.md").read_text(encoding="utf-8"), hint
    assert not data["settings"]["quick"] and data["settings"]["k"] == 3
    assert {"en", "fr", "de", "es", "it", "ja", "ru", "pt"} <= set(data["languages"])
    for r in data["languages"].values():
        assert r["n"] >= 6 and not any(r["errors"].values())
    assert data["targets"] == targets(data["languages"], data["weighted"], data.get("weighted_equal"))
    if data["settings"].get("planned_k") == "planner":  # the fleet `polyspec deploy plan` chose, at its own k
        assert data["plan"]["entries"] == data["planner_plan"]["entries"]
    else:
        assert all(e["k"] in (0, data["settings"].get("planned_k") or 3) for e in data["plan"]["entries"])


# --- scripts/' reports: the blocks of docs/results.md and docs/training.md from the committed JSON ----------------


def _script(name: str):
    """A module of scripts/ (the lab's report scripts; not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUALITY_RUNS = ("quality16", "quality16b", "quality16c", "quality16d")


@pytest.mark.parametrize("name", QUALITY_RUNS)
def test_quality_tables_are_the_rendering_of_the_committed_records(name: str) -> None:
    """docs/results/NAME_tables.md of the issue-16 runs is scripts/quality_report.py's rendering of NAME.json."""
    data = json.loads((DOCS / f"{name}.json").read_text(encoding="utf-8"))
    tables = "\n".join(_script("quality_report").tables(data["records"], data["run"], data["curves"]))
    committed = (DOCS / f"{name}_tables.md").read_text(encoding="utf-8")
    assert committed.split("\n", 2)[2] == tables + "\n", (
        f"docs/results/{name}_tables.md is stale: regenerate it with "
        f"`python scripts/quality_report.py docs/results/{name}.json --write docs/results`")


@pytest.mark.parametrize("name", QUALITY_RUNS[:3])
def test_quality_blocks_are_the_rendering_of_the_committed_records(name: str) -> None:
    """docs/results.md §11-13's blocks are the rendering of the committed records, and name the command that
    reads them."""
    import re

    report = _script("quality_report")
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    begin, end = report.marks(name)
    command = re.search(r"```\n(python scripts/quality_report\.py [^\n]+)\n```", page.split(begin, 1)[1].split(end, 1)[0])
    assert command and command[1] == (f"python scripts/quality_report.py docs/results/{name}.json "
                                      "--write docs/results --results-md docs/results.md")
    data = json.loads((DOCS / f"{name}.json").read_text(encoding="utf-8"))
    records = data["records"]
    drafts = list(dict.fromkeys(r["draft"] for r in records))
    lang_of = {r["draft"]: r.get("target_language", "en") for r in records}
    block = "\n".join(report.section(name, records, data["run"], drafts, lang_of, command[1]))
    assert block in page, f"docs/results.md's {name} block is stale: regenerate it with `{command[1]}`"


def test_training_page_holds_the_multilingual_blocks() -> None:
    """docs/training.md's multilingual GPU blocks are scripts/multilingual_report.py's rendering of
    docs/results/multilingual.json, which holds every stage's seconds and every language's figures."""
    report = _script("multilingual_report")
    data = json.loads(report.RESULTS.read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert "\n".join(report.seconds_block(data)) in page
    assert "\n".join(report.figures_block(data)) in page
    assert len(data["languages"]) == 18 and data["device"].startswith("cuda")
    assert all(data["seconds"][s] > 0 for s in report.STAGES)
    assert all(data["coverage"][lang] >= 0.95 for lang in data["languages"])
    assert set(data["figures"]["heldout"]) == set(data["languages"])
    assert len(data["figures"]["mtbench"]) == 9 and data["mtbench_turns"] == [1, 2]


def test_the_warm_started_run_has_its_own_blocks_and_ship_criterion() -> None:
    """The shipped run (warm start from the English base) has its own blocks in docs/training.md, and its targets
    and ship criterion against the drafts it was measured against in docs/results.md."""
    report = _script("multilingual_report")
    warm = DOCS / "multilingual-warm.json"
    data = json.loads(warm.read_text(encoding="utf-8"))
    training = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert "\n".join(report.seconds_block(data, warm.stem)) in training
    assert "\n".join(report.figures_block(data, warm.stem)) in training
    assert "\n".join(report.compare_block(data, warm.stem)) in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert len(data["languages"]) == 18 and all(data["seconds"][s] > 0 for s in report.STAGES)
    assert set(data["figures"]["heldout"]) == set(data["languages"]) and len(data["figures"]["mtbench"]) == 9
    assert {"smollm2-135m-instruct-en", "smollm2-135m-instruct-multi"} <= set(data["reference"])


def test_results_page_holds_the_unseen_language_table() -> None:
    """docs/results.md §16's unseen-language table is the rendering of docs/results/multilingual-unseen.json:
    the English base and the multilingual draft on all seven files of bench/data/unseen."""
    report = _script("multilingual_report")
    unseen = DOCS / "multilingual-unseen.json"
    data = json.loads(unseen.read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert "\n".join(report.unseen_block(data, unseen.stem)) in page
    assert data["drafts"] == ["smollm2-135m-instruct-en", "smollm2-135m-instruct-multi"]
    files = {f.stem for f in (ROOT / "bench" / "data" / "unseen").glob("*.jsonl")}
    assert all(set(data["figures"][d]) == files for d in data["drafts"])
