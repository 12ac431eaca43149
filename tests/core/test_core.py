"""The leaf package's one-home concepts: each behaves as documented, including on bad input."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from polyspec.core import acceptance as A
from polyspec.core.atomic import atomic_dir, atomic_path, atomic_write_json, atomic_write_text
from polyspec.core.cli import PolyspecTyper, missing_extra
from polyspec.core.counters import SpecCounts
from polyspec.core.domains import code_signals, detect_domain
from polyspec.core.text import WINDOW, head_and_tail
from polyspec.core.errors import ConflictError, IntegrityError, InvalidInput, NotFoundError, PolyspecError, Unavailable
from polyspec.core.languages import UnknownLanguage, is_language, normalize_language, normalize_languages
from polyspec.core.prompts import PromptsError, read_prompt_records, read_prompts

# --- acceptance arithmetic --------------------------------------------------------------------------------


def test_acceptance_forms_agree_and_the_empty_case_is_defined_once() -> None:
    hist = [5, 3, 2, 0]  # 10 steps: 5 accepted none, 3 one, 2 two
    pos = A.positions_from_histogram(hist)
    assert pos == pytest.approx([0.5, 0.2, 0.0])
    assert A.mal_from_histogram(hist) == pytest.approx(1 + (3 + 4) / 10) == pytest.approx(A.mal_from_positions(pos))
    assert A.positions_from_counts([5, 2, 0], 10) == pytest.approx(pos)
    # No verify step: nothing measured. Rates are zeros, MAL is None (never 1.0).
    assert A.positions_from_histogram([0, 0, 0, 0]) == [0.0, 0.0, 0.0]
    assert A.mal_from_histogram([0, 0, 0, 0]) is None
    assert A.mean_acceptance_length(0, 0) is None
    assert A.positions_from_counts([0, 0], 0) == [0.0, 0.0]


def test_histograms_of_different_k_do_not_merge() -> None:
    assert A.merge_histograms([[1, 2, 3], [4, 5, 6]]) == [5, 7, 9]
    assert A.merge_histograms([]) == []
    with pytest.raises(ValueError, match="different k"):
        A.merge_histograms([[1, 2], [1, 2, 3]])


# --- counters ---------------------------------------------------------------------------------------------


def test_counts_add_subtract_and_derive_figures() -> None:
    a = SpecCounts.from_vllm_metrics({"acceptance_histogram": [2, 1, 1], "num_draft_tokens": 8}, 7)
    assert (a.requests, a.completion_tokens, a.num_spec_steps, a.num_accepted_tokens) == (1, 7, 4, 3)
    assert a.accepted_per_pos == (2, 1) and a.acceptance == pytest.approx([0.5, 0.25])
    b = SpecCounts(requests=1, num_spec_steps=1, num_accepted_tokens=3, accepted_per_pos=(1, 1, 1))
    total = a + b
    assert total.accepted_per_pos == (3, 2, 1) and total.num_spec_steps == 5
    assert total.mean_acceptance_length == pytest.approx(1 + 6 / 5)
    assert total - b == a + SpecCounts(accepted_per_pos=(0, 0, 0)) - SpecCounts()  # padding is harmless
    assert SpecCounts().mean_acceptance_length is None and SpecCounts().acceptance == []


@pytest.mark.parametrize("spec", [None, {}, "garbage", {"acceptance_histogram": "x"},
                                  {"acceptance_histogram": [1, -2]}, {"num_spec_steps": True},
                                  {"num_spec_steps": 1e300}, {"acceptance_histogram": [1.5, 2]}])
def test_malformed_engine_reports_count_as_zero_not_as_errors(spec: object) -> None:
    c = SpecCounts.from_vllm_metrics(spec, 3)  # type: ignore[arg-type]
    assert c.requests == 1 and c.completion_tokens == 3
    assert c.num_spec_steps == 0 and c.num_accepted_tokens == 0 and c.mean_acceptance_length is None


# --- atomic writes ----------------------------------------------------------------------------------------


def test_atomic_write_has_normal_modes_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"é": 1})
    assert json.loads(target.read_text(encoding="utf-8")) == {"é": 1}
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_a_full_disk_raises_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    atomic_write_text(target, "old")
    with pytest.raises(OSError), atomic_path(target) as tmp, open(tmp, "wb") as fh, open("/dev/full", "wb") as full:
        fh.write(b"x")
        full.write(b"y" * 65536)
        full.flush()
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_atomic_dir_replaces_whole_and_normalises_modes(tmp_path: Path) -> None:
    target = tmp_path / "draft"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
        os.chmod(tmp / "a", 0o600)  # what save_pretrained leaves
    assert stat.S_IMODE((target / "a").stat().st_mode) & 0o044 == 0o044  # group/other can read
    with pytest.raises(ValueError), atomic_dir(target) as tmp:
        (tmp / "b").write_text("2")
        raise ValueError("a failed save")
    assert sorted(p.name for p in target.iterdir()) == ["a"]  # the old directory, untouched
    with atomic_dir(target) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


# --- language codes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, expected", [("fr", "fr"), ("FR", "fr"), ("fra", "fr"), ("fre", "fr"), (" de ", "de"),
                                            ("yue", "yue"), ("mul", "mul")])
def test_language_codes_normalise(code: str, expected: str) -> None:
    assert normalize_language(code) == expected


@pytest.mark.parametrize("bad", ["", "frnch", "x" * 10_000, "f\r\nr", "zz"])
def test_unknown_codes_are_invalid_input_with_suggestions(bad: str) -> None:
    with pytest.raises(UnknownLanguage) as info:
        normalize_language(bad)
    assert info.value.exit_code == 2 and len(str(info.value)) < 300
    assert not is_language(bad)


def test_unknown_code_suggests_close_ones_and_lists_keep_order() -> None:
    with pytest.raises(UnknownLanguage) as info:
        normalize_language("frnch")
    assert "fr (French)" in info.value.suggestions and info.value.details() == {"suggestions": info.value.suggestions}
    assert normalize_languages("FR, fra,en") == ["fr", "en"]
    with pytest.raises(UnknownLanguage):
        normalize_language(42)  # type: ignore[arg-type]


# --- prompt files -----------------------------------------------------------------------------------------


def test_every_prompt_format_reads(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"id": "a", "prompt": "Bonjour", "lang": "fr", "domain": "general"},
        {"question_id": 81, "category": "writing", "turns": ["Un", "Deux"]},
        {"text": "Texte"},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "U1"},
                      {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
                      {"role": "assistant", "content": "dropped"}]},
    ]) + "\n\n", encoding="utf-8")
    recs = read_prompt_records(f)
    assert [r.turns for r in recs] == [("Bonjour",), ("Un", "Deux"), ("Texte",), ("U1", "U2")]
    assert recs[0].id == "a" and recs[0].lang == "fr" and recs[1].id == "81" and recs[1].category == "writing"
    assert recs[3].messages[-1] == {"role": "user", "content": "U2"} and len(recs[3].messages) == 4
    assert read_prompts(f) == ["Bonjour", "Un", "Deux", "Texte", "U1", "U2"]
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n", encoding="utf-8")
    assert [r.turns for r in read_prompt_records(plain)] == [("first prompt",), ("second prompt",)]


@pytest.mark.parametrize("content, needle", [
    ('{"prompt": "ok"}\n{not json}\n', ":2: not valid JSON"),
    ('{"prompt": "ok"}\n[1, 2]\n', ":2: expected a JSON object"),
    ('{"answer": "x"}\n', ":1: no 'prompt', 'turns', 'text' or 'messages' field"),
    ('{"turns": ["ok", 3]}\n', ":1: every entry of 'turns' must be a non-empty string"),
    ('{"turns": []}\n', ":1: the prompt is empty"),
    ('{"prompt": "   "}\n', ":1: the prompt is empty"),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}\n', ":1: 'messages' must end with a non-empty user turn"),
    ('{"messages": "hi"}\n', ":1: 'messages' must be a list"),
    ('{"messages": [{"role": "user"}]}\n', ":1: every message needs a string 'role' and 'content'"),
    ("\n \n", "no prompts in"),
])
def test_bad_prompt_files_name_the_line(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(PromptsError) as info:
        read_prompt_records(f)
    assert needle in str(info.value) and info.value.exit_code == 2


def test_unreadable_prompt_files(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="not found"):
        read_prompt_records(tmp_path / "missing.jsonl")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café\n".encode("latin-1"))
    with pytest.raises(PromptsError, match="not UTF-8"):
        read_prompt_records(latin1)
    with pytest.raises(PromptsError, match="is a directory"):
        read_prompt_records(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # not a regular file: refused instead of blocking on open
    with pytest.raises(PromptsError, match="not a regular file"):
        read_prompt_records(fifo)


# --- domains ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, domain", [
    ("```python\nprint(1)\n```", "code"),
    ("def f(x):\n    return x + 1\nprint(f(2)) == 3", "code"),
    ("import os\nfrom sys import argv", "code"),
    ("SELECT name FROM users WHERE id = 3;\nUPDATE t SET a = 1;", "code"),
    ("class Stack:\n    def push(self, x):\n        self.items.append(x)", "code"),  # two definitions
    ("Fix this:\nint main() {\n  printf(\"hi\");\n  return 0;\n}", "code"),
    ("Wie viel ist 12 * 7 + 3?", "math"),
    ("Calcule 12 * 7 + 3, s'il te plaît.", "math"),
    ("Solve the equation x^2 = 16 for x > 0.", "math"),
    ("Write a short poem about the sea in spring.", "general"),
    ("Return the book to the library; thanks!", "general"),
])
def test_domains(text: str, domain: str) -> None:
    assert detect_domain(text) == domain


def test_domain_detection_reads_a_bounded_window() -> None:
    hostile = "\n" * 40_000 + "def f():\n" + "\n" * 40_000 + "import os\n#include <x>\n@" + "\n" * 40_000
    assert len(head_and_tail(hostile)) <= 2 * WINDOW + 1
    assert detect_domain(hostile) in ("code", "general")  # answers, and reads only the window
    assert code_signals("def f():" + " " * 100_000) == code_signals("def f():")  # no backtracking on runs


# --- the CLI's error mapping --------------------------------------------------------------------------------


def _app(exc: BaseException) -> typer.Typer:
    app = PolyspecTyper()

    @app.command()
    def fail(as_json: bool = typer.Option(False, "--json")) -> None:
        raise exc

    @app.command()
    def ok() -> None:
        typer.echo("fine")

    return app


@pytest.mark.parametrize("exc, code", [
    (PolyspecError("general"), 1), (InvalidInput("bad"), 2), (NotFoundError("gone"), 3),
    (ConflictError("taken"), 4), (Unavailable("missing"), 5), (IntegrityError("sha256"), 6),
    (UnknownLanguage("unknown 'zz'", ["za (Zhuang)"]), 2),
])
def test_every_polyspec_error_maps_to_its_exit_code(exc: PolyspecError, code: int) -> None:
    res = CliRunner().invoke(_app(exc), ["fail", "--json"])
    assert res.exit_code == code and "Traceback" not in res.output
    payload = json.loads(res.stdout.splitlines()[0])
    assert payload["kind"] == type(exc).__name__ and payload["exit_code"] == code
    assert f"error: {exc.message}" in res.stderr


def test_a_missing_extra_names_the_extra_and_a_bug_keeps_its_traceback() -> None:
    res = CliRunner().invoke(_app(ModuleNotFoundError("No module named 'torch'", name="torch")), ["fail"])
    assert res.exit_code == 5 and "'ml' extra" in res.stderr and "pip install 'polyspec[ml]'" in res.stderr
    assert missing_extra(ModuleNotFoundError("x", name="not_an_extra_module")) is None
    res = CliRunner().invoke(_app(ZeroDivisionError("a bug")), ["fail"])
    assert isinstance(res.exception, ZeroDivisionError)  # not swallowed into a polite message
