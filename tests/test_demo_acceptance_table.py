"""The demo's acceptance table shows each engine's own k: live positions as deep as vLLM reported them, and
the offline figure with the k it was measured at (no engine runs)."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from polyspec.demo import LangStats, acceptance_table


class FakeRegistry:
    def best_evaluations(self, **_: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(draft="multi@1", language="ja", mean_acceptance_length=3.56, k=3),
                SimpleNamespace(draft="en@1", language="en", mean_acceptance_length=2.55, k=3)]


def _render(stats: dict[str, LangStats]) -> str:
    console = Console(width=200, record=True)
    console.print(acceptance_table(stats, FakeRegistry()))
    return console.export_text()


def test_each_language_shows_the_k_its_engine_drafts() -> None:
    ja, en, it = LangStats(), LangStats(), LangStats()
    # multi at k = 5: six histogram bins (0..5 accepted); en at k = 3: four
    ja.add({"num_spec_steps": 10, "num_accepted_draft_tokens": 30, "acceptance_histogram": [1, 1, 1, 1, 2, 4]}, 40, "multi@1")
    en.add({"num_spec_steps": 10, "num_accepted_draft_tokens": 12, "acceptance_histogram": [3, 2, 3, 2]}, 22, "en@1")
    out = _render({"ja": ja, "en": en, "it": it})
    assert "k=3" not in out and "pos 5" in out and "pos 6" not in out
    ja_row = next(line for line in out.splitlines() if line.strip("│┃ ").startswith("ja"))
    en_row = next(line for line in out.splitlines() if line.strip("│┃ ").startswith("en"))
    assert "│ 5 " in ja_row and "0.40" in ja_row and "4.00" in ja_row and "3.56 (3)" in ja_row
    assert "│ 3 " in en_row and en_row.count(" - ") >= 2 and "2.55 (3)" in en_row  # pos 4 and 5: not drafted
    assert not any(line.strip("│┃ ").startswith("it") for line in out.splitlines())  # no request: no row
