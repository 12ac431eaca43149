"""``polyspec models pull`` / ``push``: move drafts between POLYSPEC_HOME and a Hub repo or a directory.

A published draft is a directory (or Hugging Face model repository) holding config.json,
model.safetensors, manifest.json (its entry: verifier, languages, parent, sha256 of every file,
recorded evaluations) and README.md (a model card whose YAML front matter repeats the sha256). A
directory source may also be a mirror: a folder of such directories, or of the checkout's layout
(models/drafts: one index manifest.json and a folder per draft).

Pull verifies the files before installing, against every checksum published with the draft (its
manifest entry, its card, ``--sha256``), then installs them with :func:`atomic_dir`: a failure at any
point (bad source, mismatch, full or read-only disk) leaves POLYSPEC_HOME as it was. Torch-free.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

from polyspec.core.atomic import atomic_dir
from polyspec.core.errors import InvalidInput, NotFoundError, Unavailable
from polyspec.models.card import is_repo_id, model_card
from polyspec.models.checksums import sha256_file, verify_tree
from polyspec.models.shipped import (
    CONFIG_FILE, ENTRY_FILE, WEIGHTS_FILE, ShippedDraft, ShippedDraftError, check_draft_name, drafts_home,
    entry_dir, find_draft, read_entries,
)
from polyspec.models.shipped import MANIFEST as CHECKOUT_MANIFEST

CARD_FILE = "README.md"
HUB_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE, ENTRY_FILE)  # allow_patterns: nothing else is fetched
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


class HubUnavailable(Unavailable):
    """The Hugging Face Hub cannot be reached (offline, no network, no credentials)."""


class DestinationError(Unavailable):
    """The install or push destination cannot be written (read-only, full, not a directory)."""


@dataclass(frozen=True)
class Location:
    """Where a draft comes from or goes to: a local directory or a Hugging Face repository."""

    kind: str  # "dir" | "hub"
    path: Path | None = None
    repo_id: str | None = None

    def __str__(self) -> str:
        return str(self.path) if self.kind == "dir" else f"hf://{self.repo_id}"


@dataclass
class Transfer:
    """What pull or push did."""

    name: str
    source: str
    destination: str
    files: dict[str, int]
    verified_against: list[str] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "destination": self.destination, "files": self.files,
                "size_bytes": self.size_bytes, "verified_against": self.verified_against}


def parse_location(text: str) -> Location:
    """``file://...``, an existing or explicit path (/, ./, ../, ~) -> a directory; ``hf://owner/name``
    or ``owner/name`` that is not a local path -> a Hub repository. A hub mirror is reached through
    HF_ENDPOINT, which huggingface_hub reads."""
    if text.startswith("file://"):
        url = urlparse(text)
        if url.netloc not in ("", "localhost"):
            raise InvalidInput(f"{text!r}: only local file:// URLs are supported (host {url.netloc!r})")
        return Location("dir", path=Path(unquote(url.path)))
    if text.startswith("hf://"):
        repo = text[len("hf://"):].strip("/")
        if not is_repo_id(repo):
            raise InvalidInput(f"{text!r} is not a Hugging Face repository id (hf://owner/name)")
        return Location("hub", repo_id=repo)
    if "://" in text:
        raise InvalidInput(f"{text!r}: unsupported URL scheme; give a directory, file://PATH or a Hugging Face "
                           "repo id (set HF_ENDPOINT for a Hub mirror)")
    path = Path(text).expanduser()
    if path.exists() or text.startswith(("/", ".", "~")) or not is_repo_id(text):
        return Location("dir", path=path)
    return Location("hub", repo_id=text)


# --- pull ------------------------------------------------------------------------------------------
def pull_draft(name_or_repo: str, source: str | None = None, *, revision: str | None = None,
               sha256: str | None = None, home: str | Path | None = None) -> Transfer:
    """Fetch a draft and install it, verified, into POLYSPEC_HOME/drafts/<name>.

    ``name_or_repo`` is the draft's name (``source`` says where from) or, without ``source``, a Hub
    repo id. ``sha256``: the expected digest of model.safetensors, from a source the caller trusts.
    """
    if sha256 is not None and not _SHA256.fullmatch(sha256.lower()):
        raise InvalidInput(f"--sha256 {sha256!r} is not a hex sha256 (64 characters)")
    if source is None:
        if not is_repo_id(name_or_repo):
            check_draft_name(name_or_repo)
            raise InvalidInput(f"say where to pull {name_or_repo!r} from",
                               hint=f"polyspec models pull {name_or_repo} --from <Hugging Face repo id or directory>")
        name, where = None, Location("hub", repo_id=name_or_repo)
    else:
        name, where = check_draft_name(name_or_repo), parse_location(source)
    if revision is not None and where.kind != "hub":
        raise InvalidInput("--revision applies to Hugging Face repositories only")
    root = drafts_home(home)
    if where.kind == "dir":
        assert where.path is not None
        draft_dir, entry = locate_in_directory(where.path, name)
        return _install(draft_dir, entry, name or draft_dir.name, root, str(where), sha256)
    _ensure_dir(root)
    try:
        staging = tempfile.TemporaryDirectory(dir=root, prefix=".pull-")
    except OSError as exc:
        raise DestinationError(f"cannot write under {root}: {exc.strerror or exc}") from None
    with staging as tmp:
        assert where.repo_id is not None
        fetched = _download(where.repo_id, revision, Path(tmp))
        draft_dir, entry = locate_in_directory(fetched, name)
        # Without a name, the draft keeps the one its manifest entry gives, else the repository's.
        name = name or str(entry.get("name") or where.repo_id.split("/")[-1])
        return _install(draft_dir, entry, name, root, str(where) + (f"@{revision}" if revision else ""), sha256)


def locate_in_directory(path: Path, name: str | None) -> tuple[Path, dict[str, Any]]:
    """The draft directory under ``path`` (the draft itself, or a mirror holding ``name``) and its entry."""
    if not path.exists():
        raise NotFoundError(f"draft source {path} does not exist")
    if not path.is_dir():
        raise InvalidInput(f"draft source {path} is not a directory")
    draft_dir, entry = path, None
    is_draft = (path / WEIGHTS_FILE).exists() or (path / CONFIG_FILE).exists()
    if not is_draft and name is not None:
        index = [e for e in _entries(path / ENTRY_FILE) if e.get("name") == name]
        draft_dir = entry_dir(path, index[0]) if index else path / name
        entry = index[0] if index else None
        if not draft_dir.is_dir():
            raise NotFoundError(f"{path} holds no draft {name!r} (no {draft_dir.name}/ and no manifest entry)")
    if entry is None:
        own = _entries(draft_dir / ENTRY_FILE)
        entry = next((e for e in own if name is None or e.get("name") == name), own[0] if len(own) == 1 else None)
    if entry is None and draft_dir == path and draft_dir.parent != draft_dir:
        # One folder of a mirror in the checkout's layout: its entry is in the index beside it.
        siblings = _entries(draft_dir.parent / ENTRY_FILE) if (draft_dir.parent / ENTRY_FILE).is_file() else []
        entry = next((e for e in siblings if (e.get("dir") or e.get("name")) == draft_dir.name), None)
    for required in (CONFIG_FILE, WEIGHTS_FILE):
        if not (draft_dir / required).is_file():
            raise InvalidInput(f"{draft_dir} is not a draft: it has no {required}")
    return draft_dir, dict(entry or {})


def _entries(manifest: Path) -> list[dict[str, Any]]:
    return read_entries(manifest) if manifest.is_file() else []


def _download(repo_id: str, revision: str | None, into: Path) -> Path:
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(HUB_FILES), local_dir=into))
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError) as exc:
        raise NotFoundError(f"Hugging Face repository {repo_id!r}{f' at {revision!r}' if revision else ''} "
                            f"was not found or is not accessible: {_first_line(exc)}",
                            hint="check the id and revision; private repositories need HF_TOKEN") from None
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled, hf_errors.HfHubHTTPError,
            OSError) as exc:
        raise HubUnavailable(f"cannot download {repo_id!r} from the Hugging Face Hub: {_first_line(exc)}",
                             hint="check the network, HF_HUB_OFFLINE and HF_ENDPOINT, or pull from a directory: "
                                  "--from DIR") from None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[:2]).strip()
    return f"{type(exc).__name__}: {text[:300]}"


def published_checksums(draft_dir: Path, entry: dict[str, Any], sha256: str | None) -> dict[str, dict[str, str]]:
    """Every set of checksums published with the draft, by where it was read: all must hold."""
    found: dict[str, dict[str, str]] = {}
    if entry.get("checksums"):
        found[ENTRY_FILE] = _checked_sums(entry["checksums"], ENTRY_FILE)
    card = read_card(draft_dir / CARD_FILE)
    card_sums = (card.get("polyspec") or {}).get("sha256") if isinstance(card.get("polyspec"), dict) else None
    if card_sums:
        found[CARD_FILE] = _checked_sums(card_sums, CARD_FILE)
    if sha256 is not None:
        found["--sha256"] = {WEIGHTS_FILE: sha256.lower()}
    return found


def _checked_sums(sums: Any, where: str) -> dict[str, str]:
    # The file names come from the source: they must stay inside the draft directory.
    if not isinstance(sums, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and _SHA256.fullmatch(v) and "/" not in k and "\\" not in k
            and not k.startswith(".") for k, v in sums.items()):
        raise InvalidInput(f"the checksums in {where} are malformed (expected file name -> hex sha256)")
    return dict(sums)


def check_draft_files(draft_dir: Path) -> None:
    """config.json is a JSON object and model.safetensors has a well-formed header (not an HTML error
    page or a truncated download)."""
    try:
        config = json.loads((draft_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShippedDraftError(f"{draft_dir / CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ShippedDraftError(f"{draft_dir / CONFIG_FILE} is not a JSON object")
    weights = draft_dir / WEIGHTS_FILE
    size = weights.stat().st_size
    with open(weights, "rb") as fh:
        head = fh.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        ok = 0 < length <= min(_MAX_HEADER, size - 8)
        try:
            ok = ok and isinstance(json.loads(fh.read(length)), dict)
        except (UnicodeDecodeError, json.JSONDecodeError):
            ok = False
    if not ok:
        raise ShippedDraftError(f"{weights} is not a safetensors file (bad header)")


def _install(draft_dir: Path, entry: dict[str, Any], name: str, root: Path, source: str,
             sha256: str | None) -> Transfer:
    name = check_draft_name(name)
    expected = published_checksums(draft_dir, entry, sha256)
    check_draft_files(draft_dir)
    for where, sums in expected.items():  # before anything is written
        _verify(draft_dir, sums, name, where)
    files = [f for f in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE) if (draft_dir / f).is_file()]
    target = root / name
    _ensure_dir(root)
    try:
        with atomic_dir(target) as tmp:
            for f in files:
                shutil.copyfile(draft_dir / f, tmp / f)
            for where, sums in expected.items():  # the copy, too: a short write must not be installed
                _verify(tmp, sums, name, where)
            sums = {f: sha256_file(tmp / f) for f in (CONFIG_FILE, WEIGHTS_FILE)}
            record = {k: v for k, v in entry.items() if k != "dir"} or _entry_from_card(draft_dir / CARD_FILE)
            record.update(name=name, checksums=sums, source={"from": source, "verified_against": sorted(expected)})
            record.setdefault("verifier", _config_verifier(tmp / CONFIG_FILE))
            (tmp / ENTRY_FILE).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise DestinationError(f"cannot install draft {name} into {target}: {exc.strerror or exc}; nothing was installed",
                               hint="free some space, or point POLYSPEC_HOME at a writable directory") from None
    return Transfer(name=name, source=source, destination=str(target),
                    files={f: (target / f).stat().st_size for f in files + [ENTRY_FILE]}, verified_against=sorted(expected))


def _verify(root: Path, sums: dict[str, str], name: str, where: str) -> None:
    problems = verify_tree(root, sums)
    if problems:
        raise ShippedDraftError(f"draft {name} does not match the checksums of its {where}: " + "; ".join(problems)
                                + "; nothing was installed", hint="the download or the mirror is corrupted: fetch it again")


def _entry_from_card(card: Path) -> dict[str, Any]:
    """What a model card says about a draft that came without its manifest entry."""
    front = read_card(card)
    block = front.get("polyspec") if isinstance(front.get("polyspec"), dict) else {}
    langs = front.get("language") or []
    entry = {k: block[k] for k in ("verifier", "role", "parent") if block.get(k)}
    return {**entry, "languages": [langs] if isinstance(langs, str) else list(langs)} if front else {}


def _config_verifier(config: Path) -> str:
    data = json.loads(config.read_text(encoding="utf-8"))
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    return str(verifier.get("name_or_path") or "unknown")


def _ensure_dir(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DestinationError(f"cannot create {root}: {exc.strerror or exc}",
                               hint="point POLYSPEC_HOME at a writable directory") from None


# --- push ------------------------------------------------------------------------------------------
def push_draft(name: str, to: str, *, license: str = "apache-2.0", base_model: str | None = None,
               home: str | Path | None = None, manifest: Path = CHECKOUT_MANIFEST) -> Transfer:
    """Publish draft ``name`` (from the checkout or POLYSPEC_HOME) with a model card: into ``to``/<name>
    when ``to`` is a directory, or to the Hugging Face repository ``to`` (created if needed)."""
    draft = find_draft(name, home=home, manifest=manifest)
    draft.verify()
    where = parse_location(to)
    card = model_card(draft, license=license, base_model=base_model,
                      repo_id=where.repo_id if where.kind == "hub" else None)
    files = {f: (draft.path / f).stat().st_size for f in (CONFIG_FILE, WEIGHTS_FILE)}
    if where.kind == "dir":
        assert where.path is not None
        target = where.path / draft.name
        _ensure_dir(where.path)
        try:
            with atomic_dir(target) as tmp:
                _write_bundle(draft, tmp, card)
                _verify(tmp, draft.checksums, draft.name, "manifest")
        except OSError as exc:
            raise DestinationError(f"cannot write draft {draft.name} to {target}: {exc.strerror or exc}; "
                                   "nothing was written") from None
        dest = str(target)
    else:
        assert where.repo_id is not None
        with tempfile.TemporaryDirectory(prefix="polyspec-push-") as tmp:
            _write_bundle(draft, Path(tmp), card)
            _upload(where.repo_id, Path(tmp), draft.name)
        dest = str(where)
    files.update({ENTRY_FILE: len(json.dumps(draft.to_entry(), indent=1)), CARD_FILE: len(card.encode())})
    return Transfer(name=draft.name, source=str(draft.path), destination=dest, files=files,
                    verified_against=[ENTRY_FILE])


def _write_bundle(draft: ShippedDraft, into: Path, card: str) -> None:
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copyfile(draft.path / f, into / f)
    (into / ENTRY_FILE).write_text(json.dumps(draft.to_entry(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (into / CARD_FILE).write_text(card, encoding="utf-8")


def _upload(repo_id: str, folder: Path, name: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                          commit_message=f"polyspec models push {name}")
    except (hf_errors.OfflineModeIsEnabled, hf_errors.HfHubHTTPError, OSError) as exc:
        raise HubUnavailable(f"cannot push {name} to the Hugging Face repository {repo_id!r}: {_first_line(exc)}",
                             hint="check the network and HF_HUB_OFFLINE; log in (`hf auth login`) or set HF_TOKEN "
                                  "with write access") from None


def read_card(path: Path) -> dict[str, Any]:
    """The YAML front matter of a model card (empty when there is no card or no front matter)."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        raise InvalidInput(f"{path}: the YAML front matter has no closing '---'")
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: the YAML front matter is not valid: {exc}") from None
    return data if isinstance(data, dict) else {}
