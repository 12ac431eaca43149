"""Closed-loop adaptation at full size: `polyspec up` serves the shipped English
draft only, Italian (and some English) users talk to the router with capture on, `polyspec adapt once` trains
an Italian draft from that traffic, gates it, canaries it and swaps it in while the users keep talking.

Measured, per run (docs/results/adaptation.json, {"runs": [...]}, one run per language and device):

- ``live_mal_before`` / ``live_tps_before``: Italian served by the English draft, over the minutes before the
  adaptation (live counters of the router, in the registry);
- ``live_mal_after`` / ``live_tps_after``: Italian served by the swapped-in draft, over a window after the swap;
- ``requests_during_swap`` / ``failed_requests_during_swap``: client requests from the canary's start to the
  end of the swap (every request of the run is checked: status, body, stream end);
- ``minutes_detection_to_serving``: from the trigger event to the swap event.

Training runs where `POLYSPEC_ADAPT_DEVICE` says (auto: a GPU when there is one, else the CPU); on a CPU host the
sizes are small (--prompts, --epochs). Hours on 2 cores at the defaults; the end-to-end test is the quick form.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/adapt.py --language it
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402

from bench.common import ROOT, BenchError, machine_info  # noqa: E402
from polyspec.core.atomic import atomic_write_json  # noqa: E402
# The fleet and its users are the end-to-end test's (tests/adapt/test_e2e.py), at full size here.
from tests.adapt.fleet import Traffic, prompts, start_fleet, stop_fleet  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "adaptation.json"


def live_of(reg: Any, language: str) -> dict[str, dict[str, Any]]:
    """Cumulative live counters of ``language`` per draft (polyspec.adapt.canary.per_draft)."""
    from polyspec.adapt.canary import per_draft

    return per_draft(reg.live_stats(), language, "general")


def figures(then: dict[str, Any] | None, now: dict[str, Any] | None) -> dict[str, Any]:
    """MAL and tokens/s of the traffic between two cumulative snapshots of one draft."""
    from polyspec.adapt.canary import _minus

    if not now:
        return {"requests": 0, "mal": None, "tps": None}
    d = _minus(now, then)
    mal = 1 + sum(d["p"]) / d["n"] if d["n"] > 0 else (1.0 if d["r"] else None)
    return {"requests": d["r"], "mal": round(mal, 4) if mal else None,
            "tps": round(d["t"] / d["s"], 3) if d["s"] > 0 else None}


def run(language: str, out: Path, prompts_n: int, epochs: int, window_s: float, answer_tokens: int,
        think_s: float = 2.0, gate_margin: float = 0.1) -> dict[str, Any]:
    from polyspec.models.verifiers import prepare_verifier
    from polyspec.registry import open_registry

    verifier = prepare_verifier()
    knobs = {"MIN_REQUESTS": "8", "MIN_TRAIN_PROMPTS": str(prompts_n), "MIN_HELDOUT": "16", "HELDOUT_FRACTION": "0.15",
             # CPU-sized fine-tune, as tests/adapt/test_e2e.py: with the defaults (8,192-token packs, warm-up 40) a
             # few dozen prompts make 2 packs an epoch, and the first run gained 0.01 MAL (the gate wants 0.02)
             "REPLAY_RATIO": "2.0", "LR": "0.001", "WARMUP_STEPS": "2", "TOTAL_SEQ_LEN": "1024",
             "ANSWERS": "engine", "ANSWER_TOKENS": str(answer_tokens), "EPOCHS": str(epochs),
             "GATE_QUESTIONS": "16", "GATE_TOKENS": "64", "GATE_MARGIN": str(gate_margin), "CANARY_SHARE": "0.5",
             "CANARY_MIN_REQUESTS": "10", "CANARY_POLL_S": "5", "CANARY_TIMEOUT_S": "900", "ENGINE_THREADS": "1",
             "COOLDOWN_S": "0", "DRAIN_TIMEOUT_S": "120", "ENGINE_READY_TIMEOUT_S": "900", "LANGUAGES": json.dumps([language])}
    env = {f"POLYSPEC_ADAPT_{k}": v for k, v in knobs.items()}
    target, english = prompts(language)
    with tempfile.TemporaryDirectory(prefix="polyspec-bench-adapt-") as tmp:
        root = Path(tmp)
        proc, base, url, env = start_fleet(verifier, root, env)
        reg = open_registry(url)
        try:
            with Traffic(base, target, english, language, think_s=think_s) as traffic:
                capture = root / "capture" / f"{language}.jsonl"
                deadline = time.monotonic() + 3 * 3600
                while not capture.is_file() or len(capture.read_text().splitlines()) < prompts_n + 16:
                    if time.monotonic() > deadline:
                        raise BenchError(f"too few captured {language} prompts after 3 h")
                    time.sleep(5)
                before_start = live_of(reg, language).get("en-base@1")
                time.sleep(window_s)
                before = figures(before_start, live_of(reg, language).get("en-base@1"))
                result = subprocess.run([sys.executable, "-m", "polyspec.cli", "adapt", "once", "--json"], cwd=ROOT,
                                        env=env, capture_output=True, text=True)
                cycle = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
                if cycle.get("status") != "swapped":
                    from polyspec.registry.adaptation import summary

                    steps = [f"{e.step} {e.status}: {summary(e)}" for e in reg.adaptation_events(language)]
                    raise BenchError(f"adapt once ended {cycle.get('status')}; the audit trail:\n" + "\n".join(steps)
                                     + f"\n{result.stderr[-2000:]}")
                swap = reg.last_adaptation(language, "swap")
                candidate = swap.details["candidate"]
                after_start = live_of(reg, language).get(candidate)
                time.sleep(window_s)
                after = figures(after_start, live_of(reg, language).get(candidate))
            events = {(e.step, e.status): e for e in reg.adaptation_events(language)}
            trigger, canary = events[("trigger", "done")], events[("canary", "starting")]
            during = traffic.between(canary.created_at.timestamp(), swap.created_at.timestamp() + 1)
            training = events[("training", "done")].details
            row = {"language": language, "trained_on": _device(),
                   "train_prompts": training["dataset"]["train"], "heldout_prompts": training["dataset"]["heldout"],
                   "live_mal_before": before["mal"], "live_mal_after": after["mal"],
                   "live_tps_before": before["tps"], "live_tps_after": after["tps"],
                   "requests_before": before["requests"], "requests_after": after["requests"],
                   "requests_during_swap": during[0], "failed_requests_during_swap": during[1],
                   "failed_requests_total": len(traffic.failures), "requests_total": traffic.requests,
                   "minutes_detection_to_serving": round((swap.created_at - trigger.created_at).total_seconds() / 60, 2),
                   "candidate": candidate, "window_s": window_s, "think_s": think_s, "epochs": epochs,
                   "answer_tokens": answer_tokens, "gate_margin": gate_margin, "knobs": knobs,
                   "machine": machine_info()}
        finally:
            reg.close()
            stop_fleet(proc, url)
    _store(out, row)
    return row


def _device() -> str:
    """Where `POLYSPEC_ADAPT_DEVICE=auto` trains: a GPU when torch sees one."""
    import torch

    wanted = os.environ.get("POLYSPEC_ADAPT_DEVICE", "auto")
    return wanted if wanted != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")


def _store(out: Path, row: dict[str, Any]) -> None:
    """Replace the run of the same language and device, keep the others."""
    runs = json.loads(out.read_text()).get("runs", []) if out.is_file() else []
    runs = [r for r in runs if (r.get("language"), r.get("trained_on")) != (row["language"], row["trained_on"])]
    atomic_write_json(out, {"runs": runs + [row]})


def main(language: str = typer.Option("it", help="A language the fleet serves with no draft of its own."),
         prompts_n: int = typer.Option(120, "--prompts", help="Captured prompts a training waits for."),
         epochs: int = typer.Option(6, help="Training epochs."),
         window_s: float = typer.Option(180.0, "--window", help="Seconds of traffic measured before and after."),
         answer_tokens: int = typer.Option(96, help="Verifier answer length for training."),
         think_s: float = typer.Option(2.0, "--think", help="Each simulated user's pause between requests (s): "
                                       "on a small CPU host, traffic and training share the cores."),
         gate_margin: float = typer.Option(0.1, help="Largest English (and other-language) MAL drop the gate "
                                           "tolerates. The product's default, 0.02, assumes a full-size training; "
                                           "a CPU-sized one (a few dozen prompts) moves English by more than that."),
         out: Path = typer.Option(RESULTS, help="Results JSON.")) -> None:
    """Run one closed-loop adaptation under traffic and record it in docs/results/adaptation.json."""
    row = run(language, out, prompts_n, epochs, window_s, answer_tokens, think_s, gate_margin)
    typer.echo(json.dumps(row, indent=2))


if __name__ == "__main__":
    typer.run(main)
