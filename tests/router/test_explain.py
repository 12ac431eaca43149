"""`polyspec route explain` against real registries populated through the registry API.

The command runs in-process through typer's CliRunner (the root app, as the console script mounts it), and
once in a fresh interpreter to show it loads no torch. The last test sends the same requests to a served
router and checks that explain predicted the router's decision, as the router's own response headers tell it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from polyspec.cli import app
from tests.router.conftest import add_draft, serve_router
from tests.router.fakes import BrokenEngine
from polyspec.core.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
FRENCH = "Bonjour, pouvez-vous m'expliquer comment fonctionne la photosynthèse chez les plantes vertes ?"
ENGLISH = "Could you explain how photosynthesis works in green plants, step by step?"
CODE = "Why does this fail?\n\ndef total(items):\n    return sum(i.price for i in items)\n\nimport os\n"


def body(text: str, **extra: object) -> str:
    return json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": text}], **extra})


def explain(registry_url: str, stdin: str | bytes, *args: str, env: dict[str, str] | None = None):
    runner = CliRunner()
    return runner.invoke(app, ["route", "explain", "--registry", registry_url, *args], input=stdin,
                         env={"POLYSPEC_ROUTER_DEFAULT_LANGUAGE": "en", **(env or {})})


def explained(registry_url: str, stdin: str, *args: str) -> dict:
    result = explain(registry_url, stdin, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def live_stats(registry, draft: str, language: str, steps: int, mal: float, domain: str = "general") -> None:
    """Live acceptance for (language, domain, draft) as a router would have persisted it."""
    registry.record_live_stats("another-router", [{
        "language": language, "domain": domain, "draft_name": draft, "requests": 10, "num_spec_steps": steps,
        "num_draft_tokens": 3 * steps, "num_accepted_tokens": round((mal - 1) * steps), "accepted_per_pos": []}])


@pytest.fixture()
def pools(registry, fake_verifier, fake_draft_dir):
    """en default pool; fr pool (offline 2.30, live 2.52 over 800 steps); en/code pool. URLs: nothing listens."""
    v = fake_verifier.name
    refs = {"en": add_draft(registry, fake_draft_dir, v, "en-draft", ["en"], {"en": 2.0}),
            "fr": add_draft(registry, fake_draft_dir, v, "fr-draft", ["fr"], {"fr": 2.3}),
            "code": add_draft(registry, fake_draft_dir, v, "code-draft", ["en"], {"en": 2.6}, domain="code")}
    registry.deploy(refs["en"], name="en-engine", url="http://127.0.0.1:9101", default=True)
    registry.deploy(refs["fr"], name="fr-engine", url="http://127.0.0.1:9102")
    registry.deploy(refs["code"], name="code-engine", url="http://127.0.0.1:9103", domain="code")
    live_stats(registry, refs["fr"], "fr", 800, 2.52)
    return refs


def test_french_prompt_picks_the_fr_pool_with_its_reason(registry_url, pools):
    out = explained(registry_url, body(FRENCH))
    d = out["decision"]
    assert (d["language"], d["source"], d["domain"], d["detected"]) == ("fr", "langid", "general", "fr")
    assert d["confidence"] >= 0.4
    assert out["endpoint"] == "chat" and out["outcome"] == {"status": 200}
    assert out["chosen"]["draft"] == pools["fr"] and out["chosen"]["replica"] == "fr-engine"
    first, fallback = out["pools"]
    blended = (2000 * 2.3 + 800 * 2.52) / (2000 + 800)  # the policy's formula, RouterConfig.prior_spec_steps=2000
    assert first["tier"] == "language+domain" and first["offline_mal"] == pytest.approx(2.3)
    assert first["live_mal"] == pytest.approx(2.52) and first["live_spec_steps"] == 800
    assert first["blended_mal"] == pytest.approx(blended)
    assert fallback["tier"] == "default" and fallback["draft"] == pools["en"] and fallback["offline_mal"] is None
    assert [a["replica"] for a in out["attempts"]] == ["fr-engine", "en-engine"]  # the failover order
    assert f"blended MAL {blended:.2f} (offline 2.30 over 2000 prior steps, live 2.52 over 800 steps)" in out["reason"]
    assert out["reason"].startswith("langid detected fr")
    assert out["health"] == "assumed" and any("not probed" in n for n in out["notes"])


def test_header_pin_is_normalised_by_the_router_and_explained(registry_url, pools):
    result = explain(registry_url, body(ENGLISH), "--header", "X-Polyspec-Language: FRA")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # the rich output, rewrapped
    assert "fr pinned by the X-Polyspec-Language header" in text
    assert f"pool {pools['fr']}|fr|general" in text and "replica fr-engine" in text
    assert "Candidate pools for fr/general" in text and "health assumed, not probed" in text
    out = explained(registry_url, body(ENGLISH), "-H", "x-polyspec-language:fr", "-H", "X-Polyspec-Domain: code")
    assert (out["decision"]["source"], out["decision"]["domain"], out["decision"]["domain_pinned"]) == \
        ("header", "code", True)
    # No fr/code pool: the fr/general pool, then the default one (the en/code pool serves no French).
    assert [p["tier"] for p in out["pools"]] == ["language", "default"]
    assert "no pool serves fr/code, so fr/general" in out["reason"]


def test_code_prompt_and_completions_body(registry_url, pools):
    out = explained(registry_url, json.dumps({"model": "polyspec", "prompt": CODE}))
    assert out["endpoint"] == "completions"  # inferred: a prompt and no messages
    assert (out["decision"]["language"], out["decision"]["domain"]) == ("en", "code")
    assert out["chosen"]["draft"] == pools["code"]
    assert "offline MAL 2.60 (no live steps yet)" in out["reason"]


def test_empty_registry_says_so(registry_url, registry):
    out = explained(registry_url, body(FRENCH))
    assert out["table_pools"] == 0 and out["pools"] == [] and out["chosen"] is None
    assert out["outcome"]["status"] == 503 and out["outcome"]["code"] == "no_healthy_backend"
    assert "no pools" in out["reason"] and "503 no_healthy_backend" in out["reason"]
    result = explain(registry_url, body(FRENCH))
    assert result.exit_code == 0, result.output
    assert "The registry has no pools" in result.stdout and "503 no_healthy_backend" in result.stdout


def test_missing_registry_is_reported_and_never_created(tmp_path):
    path = tmp_path / "nowhere" / "registry.db"
    result = explain(f"sqlite:///{path}", body(FRENCH))
    assert result.exit_code == 3, result.output  # NotFoundError's exit code (core.errors)
    assert "does not exist" in result.stderr and "polyspec registry init" in result.stderr
    assert "Traceback" not in result.output
    assert not path.exists() and not path.parent.exists()


@pytest.mark.parametrize(("stdin", "args", "env", "message"), [
    ('{"model": "polyspec", "messages": [', (), {}, "not valid JSON"),
    ("[1, 2]", (), {}, "must be a JSON object"),
    (b"\xff\xfe{}", (), {}, "not valid UTF-8"),
    ("", (), {}, "not valid JSON"),
    (body(FRENCH), ("--header", "X-Polyspec-Language fr"), {}, "is not NAME:VALUE"),
    (body(FRENCH), ("--header", ": fr"), {}, "is not NAME:VALUE"),
    (body(FRENCH), ("--endpoint", "embeddings"), {}, "--endpoint must be one of"),
    (body("x" * 2048), (), {"POLYSPEC_ROUTER_MAX_BODY_BYTES": "1024"}, "over 1024 bytes"),
    (body(FRENCH), ("-H", "X-Polyspec-Language: not a code"), {}, "pinned language"),
    (body(FRENCH), ("-H", "X-Polyspec-Language: zz"), {}, "not an ISO 639"),
    (body(FRENCH, polyspec={"domain": "astrology"}), (), {}, "pinned domain 'astrology'"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}), (), {}, "'model' is required"),
    (json.dumps({"model": "polyspec"}), (), {}, "'messages' is required"),
])
def test_bad_input_exits_2_with_one_line(registry_url, pools, stdin, args, env, message):
    result = explain(registry_url, stdin, *args, env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr.splitlines()[0]
    assert "Traceback" not in result.output and result.stdout == ""


def test_bad_input_with_json_prints_the_error_as_json(registry_url, pools):
    result = explain(registry_url, "[]", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"error": "the router would answer 400: Request body must be a JSON object.",
                                         "kind": "InvalidInput", "exit_code": 2}


def test_probe_skips_a_dead_replica_and_honours_engine_models(registry, registry_url, fake_verifier,
                                                              fake_draft_dir):
    v = fake_verifier.name
    fr = add_draft(registry, fake_draft_dir, v, "fr-draft", ["fr"], {"fr": 2.3})
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with BrokenEngine("error500") as alive:  # answers /health and /v1/models, which is all a probe asks
        registry.deploy(fr, name="fr-engine", url=dead)
        registry.deploy(None, name="en-engine", url=alive.url, languages=["en"], default=True)
        out = explained(registry_url, body(FRENCH), "--probe", "--probe-timeout", "2")
        assert out["health"] == "probed"
        assert [(p["draft"], p["replicas"][0]["healthy"]) for p in out["pools"]] == [(fr, False), ("none", True)]
        assert out["chosen"]["replica"] == "en-engine" and out["attempts"] == [out["chosen"]]
        assert "ranked 2" in out["reason"] and "first with a healthy replica" in out["reason"]
        # A model id instead of the alias: only the engines serving it (learnt by the probe) may take it.
        out = explained(registry_url, body(FRENCH, model=alive.model_id), "--probe")
        assert out["chosen"]["replica"] == "en-engine"
        assert all(r["serves_model"] == (r["name"] == "en-engine") for p in out["pools"] for r in p["replicas"])
        out = explained(registry_url, body(FRENCH, model="no-such-model"), "--probe")
        assert out["outcome"]["status"] == 404 and out["outcome"]["code"] == "model_not_found"
        assert out["chosen"] is None and "the model is refused" in out["reason"]


def test_explain_loads_no_torch(registry_url, pools):
    code = ("import sys; from polyspec.cli import app; sys.argv = ['polyspec', *sys.argv[1:]]\n"
            "try:\n    app()\nfinally:\n    print('LOADED=' + ','.join(m for m in ('torch', 'transformers', 'vllm') "
            "if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, "route", "explain", "--registry", registry_url, "--json"],
                          input=body(FRENCH), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"]["language"] == "fr"
    assert done.stderr.strip().endswith("LOADED="), done.stderr


def test_explain_agrees_with_the_live_router(registry, registry_url, fake_verifier, fake_draft_dir):
    """The same requests through a served router: its X-Polyspec-* response headers name the language,
    domain, draft and replica it chose; explain must have said the same. The engines are fakes that start
    a 200 stream (so the router sends its headers) and then cut it, so no real engine is needed."""
    v = fake_verifier.name
    refs = {"en": add_draft(registry, fake_draft_dir, v, "en-draft", ["en"], {"en": 2.0}),
            "fr-a": add_draft(registry, fake_draft_dir, v, "fr-a", ["fr"], {"fr": 2.0}),
            "fr-b": add_draft(registry, fake_draft_dir, v, "fr-b", ["fr"], {"fr": 2.5}),
            "code": add_draft(registry, fake_draft_dir, v, "code-draft", ["en"], {"en": 2.6}, domain="code")}
    # Offline, fr-b ranks first; live acceptance (5,000 steps at 3.0) lifts fr-a above it: 2.71 > 2.50.
    live_stats(registry, refs["fr-a"], "fr", 5000, 3.0)
    cases = [(FRENCH, {}, {}), (ENGLISH, {}, {}), (CODE, {}, {}), ("ok", {}, {}),
             (ENGLISH, {}, {"X-Polyspec-Language": "FR"}), (ENGLISH, {"polyspec": {"language": "fra"}}, {}),
             (FRENCH, {}, {"X-Polyspec-Domain": "code"}), (ENGLISH, {}, {"X-Polyspec-Language": "de"})]
    engines = {name: BrokenEngine("drop") for name in refs}
    for engine in engines.values():
        engine.__enter__()
    try:
        for name, ref in refs.items():
            registry.deploy(ref, name=f"{name}-engine", url=engines[name].url, default=(name == "en"),
                            **({"domain": "code"} if name == "code" else {}))
        with serve_router(registry_url, fail_threshold=1000) as router:
            for text, extra, headers in cases:
                stdin = body(text, stream=True, **extra)  # streamed: the router's headers come with the 200
                args = [a for k, val in headers.items() for a in ("-H", f"{k}: {val}")]
                out = explained(registry_url, stdin, "--threshold", "0.5", *args)
                with httpx.stream("POST", f"{router.url}/v1/chat/completions", content=stdin,
                                  headers={"Content-Type": "application/json", **headers}, timeout=30) as resp:
                    assert resp.status_code == 200
                    got = resp.headers
                d = out["decision"]
                assert (got["x-polyspec-language"], got["x-polyspec-domain"]) == (d["language"], d["domain"]), stdin
                assert float(got["x-polyspec-confidence"]) == pytest.approx(d["confidence"], abs=1e-4)
                assert (got["x-polyspec-draft"], got["x-polyspec-backend"]) == \
                    (out["chosen"]["draft"], out["chosen"]["replica"]), (stdin, headers)
        assert engines["fr-a"].completion_requests >= 2  # the live stats decided, in both
    finally:
        for engine in engines.values():
            engine.__exit__(None, None, None)
