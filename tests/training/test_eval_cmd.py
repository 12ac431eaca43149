"""`polyspec eval` through the CLI: a real offline evaluation on a tiny slice, the degenerate measure, the
conversation rounds of multi-turn benchmarks, and hostile input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from polyspec.models.degenerate import answer_shape, distinct_ratio, is_degenerate, repeated_ngram_share
from polyspec.models.shipped import SHIPPED_DIR
from polyspec.training.benchmarks import BenchmarkError, BenchmarkNotFound, load_benchmark
from polyspec.training.eval_api import conversations

FR_DRAFT = SHIPPED_DIR / "smollm2-135m-instruct-fr"
PROSE = ("The city council met on Tuesday to discuss the new budget. After a long debate, members agreed to "
         "fund two libraries, repair the old bridge over the river and hire more teachers for the schools in "
         "the northern district. The mayor said the plan would be reviewed again in the spring, when the first "
         "results of the tax reform are known, and thanked the residents who had written letters.")


def _invoke(*args: str):
    from polyspec.cli import app

    return CliRunner().invoke(app, ["eval", *args])


def _text(result) -> str:
    out = result.output
    try:
        out += result.stderr
    except (ValueError, AttributeError):  # older click: stderr mixed into output
        pass
    return out


# -- the degenerate measure -----------------------------------------------------------------------

def test_a_loop_is_degenerate_by_both_measures():
    loop = [10, 11, 12, 13, 14] * 40  # a five-token cycle, 200 tokens
    assert repeated_ngram_share(loop) > 0.9
    assert distinct_ratio(loop) < 0.05
    assert is_degenerate(loop, "ngram") and is_degenerate(loop, "distinct")


def test_a_long_loop_after_a_good_start_is_degenerate():
    start = list(range(100, 160))  # 60 distinct tokens, then the answer falls into a loop
    answer = start + [7, 8, 9] * 50
    assert answer_shape(answer).degenerate
    assert answer_shape(answer).repeated_ngram_share > 0.5


def test_normal_prose_is_not_degenerate(verifier):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(verifier.path)
    ids = tok(PROSE, add_special_tokens=False).input_ids
    shape = answer_shape(ids)
    assert shape.repeated_ngram_share < 0.1 and not shape.degenerate
    assert not is_degenerate(ids, "distinct")


def test_short_and_empty_answers_are_not_degenerate():
    assert repeated_ngram_share([]) == 0.0 and distinct_ratio([]) == 1.0
    assert not is_degenerate([5, 5, 5])  # shorter than one 4-gram: nothing can repeat
    with pytest.raises(ValueError, match="unknown degenerate measure"):
        answer_shape([1, 2], "entropy")


# -- benchmark files and conversation rounds ------------------------------------------------------

def test_turn_two_is_asked_after_the_verifiers_own_turn_one_answer(tmp_path):
    bench = tmp_path / "b.jsonl"
    bench.write_text(json.dumps({"id": "q1", "turns": ["first?", "second?"]}) + "\n"
                     + json.dumps({"id": "q2", "prompt": "alone?"}) + "\n")
    seen: list[list[list[dict]]] = []

    def answer_round(convs):
        seen.append(convs)
        return [f"answer {len(seen)}.{i}" for i in range(len(convs))]

    items = load_benchmark(bench, "2")
    assert [(it.id, it.turn) for it in items] == [("q1", 2)]  # q2 has no second turn
    where = conversations(items, answer_round)
    assert seen[0] == [[{"role": "user", "content": "first?"}]]  # turn 1 answered although only turn 2 is scored
    assert seen[1] == [[{"role": "user", "content": "first?"}, {"role": "assistant", "content": "answer 1.0"},
                        {"role": "user", "content": "second?"}]]
    assert where[("q1", 2)] == (2, 0)
    assert len(load_benchmark(bench, "all")) == 3 and len(load_benchmark(bench, 1)) == 2


def test_bundled_and_plain_text_benchmarks(tmp_path):
    assert len(load_benchmark("mtbench:fr", "all")) == 160
    assert len(load_benchmark("mtbench:fr", "1", limit=8)) == 8
    assert len({it.category for it in load_benchmark("mtbench:fr", "1", limit=8)}) == 8  # categories interleaved
    plain = tmp_path / "plain.txt"
    plain.write_text("Bonjour, qui es-tu ?\nQuelle heure est-il ?\n")
    assert [it.text for it in load_benchmark(plain, "all")] == ["Bonjour, qui es-tu ?", "Quelle heure est-il ?"]
    with pytest.raises(BenchmarkNotFound, match="mtbench:fr"):
        load_benchmark("mtbench:xx")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(BenchmarkError, match="dup.jsonl:2: id 'a' is already used"):
        load_benchmark(dup)


# -- hostile input through the CLI (every error before a model loads) ------------------------------

@pytest.mark.parametrize(("args", "code", "message"), [
    (["--bench", "/nonexistent/b.jsonl"], 3, "benchmark file not found"),
    (["--bench", "mtbench:xx"], 3, "no bundled MT-Bench file for 'xx'"),
    (["--k", "0"], 2, "--k must be >= 1"),
    (["--turns", "3"], 2, "--turns must be 1, 2 or all"),
    (["--turns", "first"], 2, "--turns must be 1, 2 or all"),
    (["--method", "magic"], 2, "--method must be one of offline, vllm"),
    (["--max-tokens", "0"], 2, "--max-tokens must be >= 1"),
    (["--limit", "0"], 2, "--limit must be >= 1"),
    (["--degenerate", "vibes"], 2, "--degenerate must be one of ngram, distinct"),
])
def test_bad_options_are_clear_errors(args, code, message):
    result = _invoke(str(FR_DRAFT), *args)
    assert result.exit_code == code, _text(result)
    assert message in _text(result)


def test_bad_benchmark_files_name_the_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "broken\n')
    for path, message in ((empty, "no prompts in"), (bad, "bad.jsonl:2: not valid JSON")):
        result = _invoke(str(FR_DRAFT), "--bench", str(path))
        assert result.exit_code == 2, _text(result)
        assert message in _text(result)


def test_unknown_draft_is_not_found(registry_url):
    result = _invoke("no-such-draft", "--bench", "mtbench:fr")
    assert result.exit_code == 3, _text(result)
    assert "no draft 'no-such-draft'" in _text(result) and "smollm2-135m-instruct-fr" in _text(result)
    result = _invoke("/nonexistent/draft", "--bench", "mtbench:fr")
    assert result.exit_code == 3 and "draft directory not found" in _text(result)


def test_a_directory_that_is_no_draft_is_refused(tmp_path):
    result = _invoke(str(tmp_path), "--bench", "mtbench:fr")
    assert result.exit_code == 2, _text(result)
    assert "is not a usable Eagle3 draft" in _text(result)


def test_a_draft_for_another_verifier_is_refused(registry_url, verifier):
    from polyspec.registry import open_registry

    with open_registry() as reg:
        reg.add_verifier(verifier, name="other-verifier")
        reg.import_draft(FR_DRAFT, verifier="other-verifier", name="fr-other", languages=["fr"])
    result = _invoke("fr-other", "--bench", "mtbench:fr", "--verifier", verifier.name)
    assert result.exit_code == 2, _text(result)
    assert "made for verifier other-verifier" in _text(result)


def test_record_needs_registry_drafts(registry_url):
    result = _invoke(str(FR_DRAFT), "--bench", "mtbench:fr", "--record")
    assert result.exit_code == 2 and "--record needs registry drafts" in _text(result)


# -- a real evaluation ----------------------------------------------------------------------------

def test_eval_offline_cpu_on_a_tiny_slice(registry_url, verifier, tmp_path):
    """2 French MT-Bench questions x 2 turns x 16 tokens with the shipped fr draft, recorded in the registry."""
    from polyspec.registry import open_registry

    with open_registry() as reg:
        reg.ensure_verifier(verifier.name)
        reg.import_draft(FR_DRAFT, verifier=verifier.name, name="fr-eval", languages=["fr"])
    out = tmp_path / "eval.json"
    result = _invoke("fr-eval", "--bench", "mtbench:fr", "--limit", "2", "--max-tokens", "16", "--device", "cpu",
                     "--json", str(out), "--record", "-q")
    assert result.exit_code == 0, _text(result)
    assert "non_degenerate" in result.output and "recorded" in result.output
    data = json.loads(out.read_text())
    assert {"benchmark", "file", "method", "verifier", "options", "seconds", "degenerate", "records",
            "answers"} <= set(data)
    assert data["method"] == "offline" and data["options"]["k"] == 3
    assert len(data["answers"]) == 4  # 2 questions x 2 turns
    assert all(0 < a["tokens"] <= 16 and set(a) >= {"id", "turn", "language", "distinct_ratio",
                                                      "repeated_ngram_share", "degenerate"} for a in data["answers"])
    records = {(r["draft"], r["language"], r["subset"]): r for r in data["records"]}
    assert set(records) == {("fr-eval", "fr", "all"), ("fr-eval", "fr", "non_degenerate")}
    n_bad = sum(a["degenerate"] for a in data["answers"])
    for r in records.values():
        assert 0.0 <= r["degenerate_share"] <= 1.0 and r["degenerate_share"] == pytest.approx(n_bad / 4)
        assert r["num_answers"] == 4 and len(r["acceptance"]) == 3 and sum(r["histogram"]) == r["num_spec_steps"]
        if r["num_spec_steps"]:
            assert r["mean_acceptance_length"] == pytest.approx(1 + sum(r["acceptance"]))
    assert records[("fr-eval", "fr", "all")]["num_prompts"] == 4
    assert records[("fr-eval", "fr", "non_degenerate")]["num_prompts"] == 4 - n_bad
    with open_registry() as reg:
        evs = reg.evaluations("fr-eval")
    assert {e.subset for e in evs} == {r["subset"] for r in records.values() if r["num_spec_steps"]}
    for e in evs:
        assert e.benchmark == "mtbench-4" and e.method == "offline" and e.language == "fr"
        assert e.mean_acceptance_length == pytest.approx(1 + sum(e.acceptance))
        assert e.degenerate_share == pytest.approx(n_bad / 4)
        assert e.details["max_new_tokens"] == 16 and e.details["turns"] == "all"


def test_help_documents_the_command():
    result = _invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for needle in ("--bench", "mtbench:fr", "--turns", "--method", "--max-tokens", "--limit", "--language", "--json",
                   "--record", "NON-DEGENERATE", "EXAMPLES", "vllm", "offline"):
        assert needle in text, needle


def test_a_messages_record_is_one_conversation_as_written(tmp_path):
    bench = tmp_path / "chat.jsonl"
    msgs = [{"role": "user", "content": "Salut"}, {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Et ensuite ?"}]
    bench.write_text(json.dumps({"id": "c1", "lang": "fr", "messages": msgs}) + "\n")
    items = load_benchmark(bench, "all")
    assert len(items) == 1 and items[0].turn == 2 and list(items[0].messages) == msgs
    where = conversations(items, lambda convs: ["x"] * len(convs))
    assert where == {("c1", 2): (1, 0)}


def test_languages_come_from_the_option_the_file_or_detection(tmp_path):
    from polyspec.training.eval_api import languages_of

    bench = tmp_path / "mixed.jsonl"
    bench.write_text(json.dumps({"id": "a", "prompt": "Quelle est la capitale de la France et pourquoi ?"}) + "\n"
                     + json.dumps({"id": "b", "prompt": "What is the capital of France, and why is it there?"}) + "\n"
                     + json.dumps({"id": "c", "lang": "deu", "prompt": "Wie spät ist es?"}) + "\n")
    items = load_benchmark(bench, "all")
    assert languages_of(items, None) == ["fr", "en", "de"]  # detected, detected, the file's (normalised) field
    assert languages_of(items, "fra") == ["fr", "fr", "fr"]


def test_vllm_method_against_an_openai_compatible_engine(tmp_path):
    """The vllm path (HTTP, conversation rounds, per-request histograms) against tests/fake_openai.py, a stand-in
    for a running engine: it answers 8 tokens with 4 spec steps accepting 1 draft each (MAL 2.0)."""
    import socket
    import threading
    import time

    import uvicorn

    from tests.fake_openai import FakeOpenAI

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(FakeOpenAI(tokens=8), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        out = tmp_path / "vllm.json"
        with pytest.warns(UserWarning, match="engine counters moved"):  # the stand-in keeps no Prometheus counters
            result = _invoke(str(FR_DRAFT), "--bench", "mtbench:de", "--method", "vllm", "--engine-url",
                             f"http://127.0.0.1:{port}", "--limit", "3", "--max-tokens", "8", "--json", str(out), "-q")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert result.exit_code == 0, _text(result)
    data = json.loads(out.read_text())
    [all_, clean] = data["records"]
    assert (all_["language"], all_["subset"], clean["subset"]) == ("de", "all", "non_degenerate")
    assert all_["histogram"] == [0, 24, 0, 0] and all_["mean_acceptance_length"] == pytest.approx(2.0)
    assert all_["num_prompts"] == 6 and len(data["answers"]) == 6  # 3 questions x 2 turns, turn 2 after turn 1
    assert _invoke(str(FR_DRAFT), str(FR_DRAFT), "--method", "vllm", "--engine-url", "http://127.0.0.1:1").exit_code == 2
