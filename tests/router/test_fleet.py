"""`polyspec up`: fleet YAML validation, planning from the registry, URL write-back, and a clean stop.

The end-to-end test runs the real CLI in a subprocess with one remote engine and stops it with SIGINT,
as Ctrl-C would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polyspec.core.ports import free_port
from polyspec.fleet.plan import FleetError, plan_from_config, plan_from_registry
from polyspec.fleet.run import set_deployment_url
from polyspec.fleet.config import FleetConfigError, load_fleet_config
from tests.cli import polyspec

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_yaml_errors_name_the_field(tmp_path):
    with pytest.raises(FleetConfigError, match="engines.0.url: Value error, url must start with http"):
        load_fleet_config(_write(tmp_path, "engines:\n  - {name: fr, url: 'ftp://x'}\n"))
    with pytest.raises(FleetConfigError, match="engine names must be unique"):
        load_fleet_config(_write(tmp_path, "engines:\n  - {name: a, port: 9001}\n  - {name: a, port: 9002}\n"))
    with pytest.raises(FleetConfigError, match="own port"):
        load_fleet_config(_write(tmp_path, "router: {port: 9001}\nengines:\n  - {name: a, port: 9001}\n"))
    with pytest.raises(FleetConfigError, match="not found"):
        load_fleet_config(tmp_path / "missing.yaml")
    with pytest.raises(FleetConfigError, match="must be a mapping"):
        load_fleet_config(_write(tmp_path, "- just a list\n"))


def test_yaml_plan_launches_local_and_registers_remote(tmp_path):
    draft = tmp_path / "en-draft"
    draft.mkdir()
    cfg = load_fleet_config(_write(tmp_path, f"""
verifier: smollm2-135m-instruct
router: {{port: 8800}}
engines:
  - {{name: en, draft: {draft}, languages: [EN], default: true}}
  - {{name: fr, url: "http://10.0.0.7:8000/", draft: fr-draft, languages: [fr]}}
"""))
    members = plan_from_config(cfg, "/models/verifier")
    en, fr = members
    assert not en.remote and en.launch["draft"] == str(draft.resolve()) and en.launch["port"] == 8101
    assert en.languages == ["en"] and en.is_default
    assert fr.remote and fr.url == "http://10.0.0.7:8000" and fr.launch is None
    bad = load_fleet_config(_write(tmp_path, "engines:\n  - {name: en, draft: /nowhere, port: 9000}\n"))
    with pytest.raises(FleetError, match="draft directory not found"):
        plan_from_config(bad, "/models/verifier")


@pytest.fixture()
def fleet_registry(verifier, base_draft_dir, registry_url):
    from polyspec.registry import open_registry

    reg = open_registry(registry_url)
    name = reg.ensure_verifier().name
    reg.import_draft(base_draft_dir, verifier=name, name="en-chat", languages=["en"], status="active")
    reg.deploy("en-chat@1", name="en-local", default=True, launch={"port": 8201, "max_model_len": 1024})
    reg.deploy("en-chat@1", name="en-remote", url="http://10.0.0.8:8000")
    yield reg
    reg.close()


def test_registry_plan_and_url_write_back(fleet_registry, base_draft_dir):
    members = {m.name: m for m in plan_from_registry(fleet_registry.active_deployments())}
    local, remote = members["en-local"], members["en-remote"]
    assert remote.remote and remote.url == "http://10.0.0.8:8000"
    assert local.launch["port"] == 8201 and local.launch["max_model_len"] == 1024
    assert local.launch["draft"] == str(base_draft_dir) and local.launch["k"] == 3

    previous = set_deployment_url(fleet_registry, "en-local", "http://127.0.0.1:8201", launched=True)
    assert previous is None
    views = {d.name: d for d in fleet_registry.active_deployments()}
    assert views["en-local"].url == "http://127.0.0.1:8201"  # the router's table now has it
    # A URL left behind by a fleet that died is relaunched, not mistaken for a remote engine.
    again = {m.name: m for m in plan_from_registry(fleet_registry.active_deployments())}
    assert not again["en-local"].remote
    assert set_deployment_url(fleet_registry, "en-local", None, launched=False) is None
    assert {d.name: d.url for d in fleet_registry.active_deployments()}["en-local"] is None
    with pytest.raises(FleetError, match="no active deployments"):
        plan_from_registry([])


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> httpx.Response:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            resp = httpx.get(url, timeout=2)
            if resp.status_code < 500:
                return resp
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout}s")


def test_up_with_remote_engine_stops_cleanly_on_sigint(tmp_path, registry_url):
    remote_port, router_port = free_port(), free_port()
    config = _write(tmp_path, f"""
router: {{port: {router_port}}}
engines:
  - {{name: far-away, url: "http://127.0.0.1:{remote_port}", draft: en-chat, languages: [en], default: true}}
""")
    env = {**os.environ, "POLYSPEC_HOME": str(tmp_path / "home"), "POLYSPEC_ADMIN_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", "up", "--config", str(config)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{router_port}"
        assert _wait_http(f"{base}/health", proc).status_code == 200
        backends = httpx.get(f"{base}/admin/api/backends", timeout=5).json()
        assert [(b["name"], b["url"], b["languages"]) for b in backends] == [
            ("far-away", f"http://127.0.0.1:{remote_port}", ["en"])]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "fleet stopped" in err and "Traceback" not in err
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/health", timeout=2)


def test_up_refuses_an_exposed_admin_before_any_engine_starts(tmp_path, registry_url, verifier):
    """`up --host 0.0.0.0` without a token would mount /admin where other machines reach it: refused with the
    fix in the message, before the fleet is shown or an engine is launched. (The prepared verifier is named: the
    empty home would otherwise convert it from GGUF first, 20 s.)"""
    draft = tmp_path / "en-draft"
    draft.mkdir()
    config = _write(tmp_path, f"""
verifier: {verifier.path}
engines:
  - {{name: en, draft: {draft}, languages: [en], default: true}}
""")
    done = polyspec("up", "--config", str(config), "--host", "0.0.0.0", "--port", str(free_port()),
                    home=tmp_path / "home", POLYSPEC_ADMIN_TOKEN="")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "refusing to serve /admin on '0.0.0.0'" in done.stderr and "POLYSPEC_ADMIN_TOKEN" in done.stderr
    assert "polyspec fleet" not in done.stderr and "Traceback" not in done.stderr
    assert not _pids_with_arg(str(draft))  # no engine was launched with that draft


def _pids_with_arg(fragment: str) -> list[int]:
    """Processes whose command line contains ``fragment`` (read from /proc; nothing is signalled)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if fragment in cmd:
                pids.append(int(entry.name))
    return pids


@pytest.mark.integration
def test_up_launches_a_real_engine_and_sigint_stops_it(verifier, base_draft_dir, tmp_path, registry_url):
    engine_port, router_port = free_port(), free_port()
    config = _write(tmp_path, f"""
verifier: {verifier.path}
router: {{port: {router_port}}}
engines:
  - {{name: en-local, draft: {base_draft_dir}, languages: [en], port: {engine_port}, default: true,
     max_model_len: 1024, kv_cache_gib: 1}}
""")
    home = tmp_path / "home"
    env = {**os.environ, "POLYSPEC_HOME": str(home), "POLYSPEC_ADMIN_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", "up", "--config", str(config)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{router_port}"
    try:
        _wait_http(f"{base}/health", proc, timeout=900)
        assert (home / "logs" / "en-local.log").is_file()
        resp = httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
            "model": "polyspec", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
        assert resp.status_code == 200, resp.text
        assert "Paris" in resp.json()["choices"][0]["message"]["content"]
        assert resp.headers.get("x-polyspec-backend") == "en-local"
        assert _pids_with_arg(f"--port {engine_port}")  # the engine runs
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "fleet stopped" in err
    assert _pids_with_arg(f"--port {engine_port}") == []  # API server, engine core and workers all gone
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{engine_port}/health", timeout=2)
