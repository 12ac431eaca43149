"""`polyspec models pull/push` and the draft lookup (checkout, then POLYSPEC_HOME/drafts).

No Hub is reachable here: sources are local directories (a mirror in the checkout's layout, a pushed
directory, file:// URLs). The Hub code paths are exercised offline, where they must fail with a clear
error. Hostile input (bad names, missing or corrupted sources, unwritable or full destinations) must
leave nothing installed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polyspec.core.errors import IntegrityError, InvalidInput, NotFoundError, PolyspecError
from polyspec.models.cli import app
from polyspec.models.hub import DestinationError, parse_location, pull_draft, push_draft, read_card
from polyspec.models.shipped import (
    MANIFEST, DraftNotFound, ShippedDraftError, find_draft, read_entries, shipped_drafts, shipped_for_language,
)

CHECKOUT = MANIFEST.parent
FR = "smollm2-135m-instruct-fr"
NO_CHECKOUT = Path("/nonexistent-polyspec-checkout/manifest.json")  # as in an installed wheel
POLYSPEC = Path(sys.executable).parent / "polyspec"


def _checkout_entry(name: str) -> dict:
    return next(e for e in read_entries(MANIFEST) if e["name"] == name)


def _everything_under(path: Path) -> list[str]:
    """Every entry under ``path``, hidden staging leftovers included."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.fixture()
def mirror(tmp_path: Path) -> Path:
    """A directory mirror holding the French draft, as `polyspec models push` writes it."""
    out = tmp_path / "mirror"
    push_draft(FR, str(out), home=tmp_path / "unused-home")
    return out


# --- lookup ----------------------------------------------------------------------------------------
def test_pull_from_the_checkout_layout_then_find_draft_resolves_it_in_home(tmp_path):
    home = tmp_path / "home"
    done = pull_draft(FR, str(CHECKOUT), home=home)  # models/drafts: an index manifest + a folder per draft
    # both side files repeat the sha256: the index entry and the model card beside the draft
    assert done.verified_against == ["README.md", "manifest.json"] and done.destination == str(home / "drafts" / FR)
    draft = find_draft(FR, home=home, manifest=NO_CHECKOUT)
    assert draft.path == home / "drafts" / FR
    draft.verify()
    want = _checkout_entry(FR)
    assert (draft.verifier, draft.languages, draft.parent, draft.role) == (
        want["verifier"], want["languages"], want["parent"], want["role"])
    assert draft.checksums == want["checksums"] and draft.evaluations == want["evaluations"]
    assert oct(draft.path.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # readable by vLLM's user too
    assert [d.name for d in shipped_drafts(manifest=NO_CHECKOUT, home=home)] == [FR]
    assert shipped_for_language(want["verifier"], "fr", home=home) is not None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_pulled_parents_are_listed_before_their_children(tmp_path):
    home = tmp_path / "home"
    for name in ("smollm2-135m-instruct-de", "smollm2-135m-instruct-en"):  # de's parent is en
        pull_draft(name, str(CHECKOUT), home=home)
    names = [d.name for d in shipped_drafts(manifest=NO_CHECKOUT, home=home)]
    assert names == ["smollm2-135m-instruct-en", "smollm2-135m-instruct-de"]


def test_the_checkout_comes_first(tmp_path):
    home = tmp_path / "home"
    pull_draft(FR, str(CHECKOUT), home=home)
    assert find_draft(FR, home=home).path == CHECKOUT / FR


def test_a_missing_draft_says_how_to_obtain_it(tmp_path):
    with pytest.raises(DraftNotFound) as err:
        find_draft("smollm2-135m-instruct-xx", home=tmp_path / "home")
    assert isinstance(err.value, NotFoundError) and err.value.exit_code == 3
    assert "polyspec models pull smollm2-135m-instruct-xx --from <Hugging Face repo id or directory>" in str(err.value)


def test_a_checkout_without_the_weights_falls_back_to_home_then_says_how_to_pull(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(MANIFEST, checkout / "manifest.json")  # listed, but no weights (a sparse or partial clone)
    home = tmp_path / "home"
    with pytest.raises(DraftNotFound, match=f"polyspec models pull {FR} --from"):
        find_draft(FR, home=home, manifest=checkout / "manifest.json")
    assert FR not in [d.name for d in shipped_drafts(manifest=checkout / "manifest.json", home=home)]
    pull_draft(FR, str(CHECKOUT), home=home)
    assert find_draft(FR, home=home, manifest=checkout / "manifest.json").path == home / "drafts" / FR


# --- push ------------------------------------------------------------------------------------------
def test_push_writes_a_model_card_and_the_entry_then_pull_verifies_both(tmp_path, mirror):
    out = mirror / FR
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "manifest.json", "model.safetensors"]
    want = _checkout_entry(FR)
    card = read_card(out / "README.md")
    assert card["library_name"] == "speculators" and "vllm" in card["tags"]
    assert card["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card["language"] == ["fr"] and card["license"] == "apache-2.0"
    assert card["polyspec"]["sha256"] == want["checksums"] and card["polyspec"]["parent"] == want["parent"]
    body = (out / "README.md").read_text(encoding="utf-8")
    benchmarks = {e["benchmark"] for e in want["evaluations"]}
    rows = [line for line in body.splitlines() if line.startswith("| ") and line.split("|")[1].strip() in benchmarks]
    assert len(rows) == len(want["evaluations"]) > 0  # every recorded evaluation is in the card
    assert "--speculative-config" in body
    entry = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert entry == {k: v for k, v in want.items() if k != "dir"}

    done = pull_draft(FR, str(mirror), home=tmp_path / "home")
    assert done.verified_against == ["README.md", "manifest.json"]
    assert (tmp_path / "home" / "drafts" / FR / "README.md").is_file()


@pytest.mark.parametrize("how", ["file-url", "draft-dir", "card-only"])
def test_pull_from_a_url_a_draft_dir_or_with_the_card_alone(tmp_path, mirror, how):
    source = {"file-url": f"file://{mirror}", "draft-dir": str(mirror / FR), "card-only": str(mirror)}[how]
    if how == "card-only":
        (mirror / FR / "manifest.json").unlink()
    done = pull_draft(FR, source, home=tmp_path / "home")
    assert done.verified_against == (["README.md"] if how == "card-only" else ["README.md", "manifest.json"])
    draft = find_draft(FR, home=tmp_path / "home", manifest=NO_CHECKOUT)
    draft.verify()
    assert draft.languages == ["fr"] and draft.verifier == "smollm2-135m-instruct"


def test_sha256_option_is_checked(tmp_path, mirror):
    home = tmp_path / "home"
    with pytest.raises(ShippedDraftError, match="--sha256"):
        pull_draft(FR, str(mirror), sha256="0" * 64, home=home)
    assert _everything_under(home) == []
    right = _checkout_entry(FR)["checksums"]["model.safetensors"]
    assert "--sha256" in pull_draft(FR, str(mirror), sha256=right, home=home).verified_against


def test_push_of_an_unknown_draft_says_how_to_pull_it(tmp_path):
    with pytest.raises(DraftNotFound, match="polyspec models pull nope --from"):
        push_draft("nope", str(tmp_path / "out"), home=tmp_path / "home")
    assert not (tmp_path / "out").exists()


# --- hostile input ---------------------------------------------------------------------------------
def test_missing_source(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        pull_draft(FR, str(tmp_path / "nowhere"), home=tmp_path / "home")
    assert _everything_under(tmp_path / "home") == []


def test_source_without_weights(tmp_path, mirror):
    (mirror / FR / "model.safetensors").unlink()
    with pytest.raises(InvalidInput, match="no model.safetensors"):
        pull_draft(FR, str(mirror), home=tmp_path / "home")
    assert _everything_under(tmp_path / "home") == []


def test_corrupted_weights_are_refused_and_the_installed_copy_survives(tmp_path, mirror):
    home = tmp_path / "home"
    pull_draft(FR, str(mirror), home=home)
    before = _everything_under(home)
    with open(mirror / FR / "model.safetensors", "r+b") as fh:
        fh.seek(4096)
        byte = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ShippedDraftError, match="model.safetensors: sha256") as err:
        pull_draft(FR, str(mirror), home=home)
    assert isinstance(err.value, IntegrityError) and "nothing was installed" in str(err.value)
    assert _everything_under(home) == before
    find_draft(FR, home=home, manifest=NO_CHECKOUT).verify()  # the old install is intact


def test_a_file_that_is_not_safetensors_is_refused_even_without_checksums(tmp_path, mirror):
    draft = mirror / FR
    (draft / "manifest.json").unlink()
    (draft / "README.md").unlink()
    (draft / "model.safetensors").write_text("<html>404 Not Found</html>\n")
    with pytest.raises(ShippedDraftError, match="not a safetensors file"):
        pull_draft(FR, str(mirror), home=tmp_path / "home")
    assert _everything_under(tmp_path / "home") == []


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/etc/x", ".hidden", "", "a" * 200, "x\\..\\y"])
def test_path_traversal_names_are_refused(tmp_path, mirror, name):
    home = tmp_path / "home"
    with pytest.raises(InvalidInput, match="invalid draft name"):
        pull_draft(name, str(mirror), home=home)
    with pytest.raises(InvalidInput, match="invalid draft name"):
        find_draft(name, home=home)
    assert _everything_under(home) == [] and not (tmp_path / "x").exists()


def test_a_hostile_mirror_index_cannot_point_outside_itself(tmp_path):
    root = tmp_path / "evil"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({"drafts": [{"name": FR, "dir": "../outside"}]}))
    with pytest.raises(InvalidInput, match="invalid draft name '../outside'"):
        pull_draft(FR, str(root), home=tmp_path / "home")
    bad_sums = tmp_path / "bad-sums" / FR
    shutil.copytree(CHECKOUT / FR, bad_sums)
    (bad_sums / "manifest.json").write_text(json.dumps({"name": FR, "checksums": {"../../etc/passwd": "0" * 64}}))
    with pytest.raises(InvalidInput, match="malformed"):
        pull_draft(FR, str(bad_sums), home=tmp_path / "home")
    assert _everything_under(tmp_path / "home") == []


def test_revision_only_for_the_hub_and_unknown_schemes(tmp_path, mirror):
    with pytest.raises(InvalidInput, match="--revision"):
        pull_draft(FR, str(mirror), revision="v1", home=tmp_path / "home")
    with pytest.raises(InvalidInput, match="unsupported URL scheme"):
        pull_draft(FR, "https://example.com/drafts", home=tmp_path / "home")
    with pytest.raises(InvalidInput, match="say where to pull"):
        pull_draft(FR, None, home=tmp_path / "home")
    assert parse_location("org/draft").kind == "hub" and parse_location("hf://org/draft").repo_id == "org/draft"
    assert parse_location("./org/draft").kind == "dir" and parse_location(str(mirror)).kind == "dir"


def test_a_destination_that_is_a_file(tmp_path, mirror):
    home = tmp_path / "home"
    home.mkdir()
    (home / "drafts").write_text("not a directory")
    with pytest.raises(DestinationError, match="cannot"):
        pull_draft(FR, str(mirror), home=home)
    with pytest.raises(DestinationError, match="cannot"):
        push_draft(FR, str(home / "drafts"), home=tmp_path / "other")
    assert (home / "drafts").read_text() == "not a directory"


# --- through the CLI: exit codes, messages, no tracebacks ------------------------------------------
def _cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([str(POLYSPEC), "models", *args], capture_output=True, text=True, env=full_env,
                          timeout=120, **kwargs)


def _without_root_override() -> list[str]:
    """Root ignores file modes; drop CAP_DAC_OVERRIDE (util-linux setpriv) so they apply to it too."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "running as root: the read-only test needs util-linux's setpriv to drop CAP_DAC_OVERRIDE"
    return [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_read_only_destination(tmp_path, mirror):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o500)
    try:
        proc = subprocess.run([*_without_root_override(), str(POLYSPEC), "models", "pull", FR, "--from", str(mirror)],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "POLYSPEC_HOME": str(home)})
    finally:
        os.chmod(home, 0o700)
    assert proc.returncode == 5, proc.stderr
    assert "error: cannot create" in proc.stderr and "Permission denied" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _everything_under(home) == []


def _small_file_limit() -> None:
    # A disk that fills up after 1 MiB, for this process only: writes past it fail with EFBIG.
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_full_destination_leaves_nothing_behind(tmp_path, mirror):
    home = tmp_path / "home"
    proc = _cli("pull", FR, "--from", str(mirror), env={"POLYSPEC_HOME": str(home)}, preexec_fn=_small_file_limit)
    assert proc.returncode == 5, proc.stderr
    assert f"error: cannot install draft {FR}" in proc.stderr and "nothing was installed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _everything_under(home) == ["drafts"]  # no half-copied draft, no hidden staging directory


@pytest.mark.parametrize("args", [["pull", "polyspec-test/no-such-draft"],
                                  ["pull", FR, "--from", "hf://polyspec-test/no-such-draft", "--revision", "v1"],
                                  ["push", FR, "--to", "polyspec-test/no-such-draft"]])
def test_the_hub_offline_is_a_clear_error(tmp_path, args):
    proc = _cli(*args, env={"POLYSPEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
                            "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 5, proc.stderr
    assert "polyspec-test/no-such-draft" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _everything_under(tmp_path / "home" / "drafts") == []


def test_cli_pull_push_and_list(tmp_path, monkeypatch):
    home = tmp_path / "home"
    runner = CliRunner()
    pushed = runner.invoke(app, ["push", FR, "--to", str(tmp_path / "out"), "--home", str(home), "--json"])
    assert pushed.exit_code == 0, pushed.output
    assert json.loads(pushed.output)["destination"] == str(tmp_path / "out" / FR)
    pulled = runner.invoke(app, ["pull", FR, "--from", str(tmp_path / "out"), "--home", str(home)])
    assert pulled.exit_code == 0, pulled.output
    assert f"pulled {FR}" in pulled.output and "sha256 verified against README.md, manifest.json" in pulled.output
    listed = runner.invoke(app, ["drafts", "--home", str(home), "--json"])
    rows = {r["name"]: r for r in json.loads(listed.output)}
    assert rows[FR]["where"] == "checkout"  # the checkout comes first
    bad = runner.invoke(app, ["pull", "../x", "--from", str(tmp_path / "out"), "--home", str(home)])
    assert bad.exit_code == 2 and "invalid draft name" in bad.output
    assert issubclass(DraftNotFound, PolyspecError)


def test_cli_drafts_checks_every_sha256(tmp_path):
    """`polyspec models drafts` lists the nine shipped drafts as verified, and names the damaged file of a
    pulled draft instead of listing it as good."""
    runner = CliRunner()
    home = tmp_path / "home"
    listed = runner.invoke(app, ["drafts", "--home", str(home), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert len(rows) == 9 and {r["sha256"] for r in rows} == {"verified"}
    assert runner.invoke(app, ["pull", FR, "--from", str(CHECKOUT), "--home", str(home)]).exit_code == 0
    copy = home / "drafts" / f"{FR}-copy"  # a pulled draft of its own name: the checkout's would hide it
    (home / "drafts" / FR).rename(copy)
    entry = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**entry, "name": copy.name}))
    weights = copy / "model.safetensors"
    weights.chmod(0o644)
    with weights.open("r+b") as f:  # one flipped byte
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    shown = runner.invoke(app, ["drafts", "--home", str(home), "--json"])
    assert shown.exit_code == 0, shown.output
    pulled = {r["name"]: r for r in json.loads(shown.output) if r["where"] == "pulled"}
    assert "model.safetensors" in pulled[copy.name]["sha256"] and pulled[copy.name]["sha256"] != "verified"
    table = runner.invoke(app, ["drafts", "--home", str(home)])
    assert table.exit_code == 0 and "verified" in table.output
