"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.postgres import pg_url  # noqa: F401  (a throwaway PostgreSQL cluster for any area's tests)
from tests.skips import ALLOWED_SKIPS, is_allowed, skip_reason

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# Engines the tests start skip graph compilation: ready in ~26 s instead of 74-120 s on 2 cores (core.settings).
# Set before any test reads the settings; subprocesses inherit it. POLYSPEC_ENGINE_EAGER=0 tests compiled engines.
os.environ.setdefault("POLYSPEC_ENGINE_EAGER", "1")
# vLLM's engine core runs its one CPU worker in its own process instead of spawning a third process that imports
# vLLM and torch again (the uni executor: vllm.platforms.cpu allows it only with V1 multiprocessing off; the API
# server still runs the engine core as a process of its own). An engine with a draft was ready in 21 s instead of
# 30 s on 2 cores (same machine, back to back). Subprocesses, and so every engine a test starts, inherit it.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# OpenMP threads that wait sleep instead of spinning (read when torch loads, so set before any test imports it;
# subprocesses inherit it, as `polyspec adapt` and `polyspec eval` set it for themselves). With 2 cores and
# anything else running (an engine, a subprocess, another test run), a spinning thread holds the core its peer
# needs: a 4-token forward of the bundled verifier took 1,185 ms instead of 85 ms, and tests/models/
# test_acceptance.py 161 s instead of 31 s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ../shared/data pack (tests may read it; the product never does)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data pack not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def verifier():
    """The bundled SmolLM2-135M-Instruct verifier, prepared once in POLYSPEC_HOME."""
    from polyspec.models.verifiers import prepare_verifier

    return prepare_verifier()


@pytest.fixture()
def registry_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite registry for one test, also exported to subprocesses through the environment."""
    from polyspec.core.settings import reset_settings_cache

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("POLYSPEC_REGISTRY_URL", url)
    reset_settings_cache()
    yield url
    reset_settings_cache()


@pytest.fixture(scope="session")
def base_draft_dir(verifier, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (untrained) speculators Eagle3 draft for the bundled verifier, English top-N vocabulary."""
    from polyspec.models.draft_build import create_draft
    from polyspec.models.vocab_ref import english_top_token_ids

    out = tmp_path_factory.mktemp("drafts") / "en-base"
    ids = english_top_token_ids(verifier.path, n=8192)
    return create_draft(verifier.path, out, t2d_token_ids=ids, num_layers=1, seed=0)


SHARED_SERVED_NAME = "smollm2"  # the model name the shared engines serve


@pytest.fixture(scope="session")
def _shared_engines(verifier, tmp_path_factory):
    """The shared engines of engine_processes, started (their processes launched, not yet waited for) and stopped
    at the end of the session."""
    from polyspec.models.shipped import shipped_for_language
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    root = tmp_path_factory.mktemp("router-engines")
    running: dict[str, VllmEngine] = {}
    try:
        for lang in ("en", "fr"):
            spec = EngineSpec(verifier=verifier.path, draft=shipped_for_language(verifier.name, lang, specialist=True).path,
                              served_model_name=SHARED_SERVED_NAME, cpu_bind="nobind", threads=1, kv_cache_gib=1,
                              max_model_len=1024)
            running[lang] = VllmEngine(spec, root / f"{lang}.log").start()
        yield running
    finally:
        for engine in running.values():
            engine.stop()


@pytest.fixture(scope="session", autouse=True)
def _start_shared_engines_early(request: pytest.FixtureRequest) -> None:
    """Launch the shared engines at the first test when a later test of this session needs them: an engine start
    is mostly one core importing vLLM twice (API server, then engine core), about 20 s that otherwise stop the
    suite at the first user, and here overlap the tests before it. Sessions that use no shared engine (or skip
    them, POLYSPEC_SKIP_INTEGRATION=1) start none."""
    skipped = os.environ.get("POLYSPEC_SKIP_INTEGRATION") == "1"
    if not skipped and any("engine_processes" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("_shared_engines")


@pytest.fixture(scope="session")
def engine_processes(_shared_engines):
    """Two real vLLM engines, lang -> VllmEngine, started once per session and shared by every test area:
    an engine start is the slow part of the suite, so a test that needs a live engine but not its own
    draft or flags uses these. They serve the shipped English base and French drafts (trained, so
    acceptance is non-zero and telemetry comparisons are not vacuous) with 1 unpinned OpenMP thread each
    (2-core machine); launched at the session's first test (_start_shared_engines_early), waited for here.
    tests/router/test_faults_engines.py kills and restarts the French one on its port; every other test sees
    them as started."""
    for engine in _shared_engines.values():
        engine.wait_ready(timeout=900, progress=False)
    return _shared_engines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # POLYSPEC_SKIP_INTEGRATION=1 gives a fast inner loop; CI always runs everything.
    if os.environ.get("POLYSPEC_SKIP_INTEGRATION") != "1":
        return
    skip = pytest.mark.skip(reason="POLYSPEC_SKIP_INTEGRATION=1")
    for item in items:
        if "integration" in item.keywords or "browser" in item.keywords:
            item.add_marker(skip)


# --- No silent skips: any skip whose reason tests/skips.py does not allow fails the session. -----------------
_UNEXPECTED_SKIPS: list[tuple[str, str]] = []


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):  # an xfail is reported as skipped; xfail_strict rules it
        return
    reason = skip_reason(report.longrepr)
    if not is_allowed(reason):
        _UNEXPECTED_SKIPS.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)  # a module-level skip (pytest.skip(allow_module_level=True), importorskip at import)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _UNEXPECTED_SKIPS and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    if not _UNEXPECTED_SKIPS:
        return
    tr = terminalreporter
    tr.section("unexpected skips (these fail the run)", sep="=", red=True, bold=True)
    for nodeid, reason in _UNEXPECTED_SKIPS:
        tr.line(f"SKIPPED {nodeid}: {reason}", red=True)
    tr.line(f"Allowed skip reasons (tests/skips.py): {', '.join(sorted(ALLOWED_SKIPS))}. A skip is either one of "
            "those or a failure: fix the environment (make test installs what it needs) or the test.")
