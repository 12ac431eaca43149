"""Where shipped drafts are found: the source checkout, else ``POLYSPEC_HOME/drafts/<name>``.

The drafts trained for the bundled verifier live in the checkout under models/drafts/ (each listed in
models/drafts/manifest.json with the sha256 of every file, its provenance and its evaluations). They
are ~20 MB each, so the wheel leaves them out: an installed polyspec gets them with
``polyspec models pull`` (models/hub.py), which installs each beside its own one-entry manifest.json.
:func:`find_draft` is the one lookup, checkout first; a missing draft raises :class:`DraftNotFound`
whose message is the command that fetches it. Torch-free.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any

from polyspec.core.errors import IntegrityError, InvalidInput, NotFoundError
from polyspec.core.languages import UnknownLanguage, normalize_languages
from polyspec.core.settings import Settings, get_settings
from polyspec.models.checksums import verify_tree

SHIPPED_DIR = Path(__file__).resolve().parent / "drafts"  # exists in a source checkout only
MANIFEST = SHIPPED_DIR / "manifest.json"
ENTRY_FILE = "manifest.json"  # beside a pulled draft: its own entry (name, checksums, evaluations, ...)
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# a shipped draft's model.safetensors: the brief's 25 MB cap on binaries in git (the default of the training limit)
MAX_WEIGHTS_BYTES: int = Settings.model_fields["max_draft_bytes"].default

# A draft name becomes a directory name: one path component, no leading dot (no "..", no hidden dirs).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
log = logging.getLogger(__name__)


class ShippedDraftError(IntegrityError):
    """A draft's files differ from its recorded checksums, or are not a draft at all."""


class DraftNotFound(NotFoundError):
    """A named draft is neither in the checkout nor in POLYSPEC_HOME/drafts."""


def pull_command(name: str) -> str:
    """The command that installs draft ``name`` (quoted in every 'not found' message)."""
    return f"polyspec models pull {name} --from <Hugging Face repo id or directory>"


def check_draft_name(name: str) -> str:
    """``name`` if it is safe as one directory name; InvalidInput otherwise (path traversal, empty, ...)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidInput(f"invalid draft name {name!r}: use letters, digits, '.', '_' and '-' "
                           "(one path component, not starting with '.', at most 128 characters)")
    return name


def drafts_home(home: str | Path | None = None) -> Path:
    """``POLYSPEC_HOME/drafts``: where pulled drafts are installed (one directory per name)."""
    return (Path(home).expanduser() if home is not None else get_settings().home) / "drafts"


@dataclass(frozen=True)
class ShippedDraft:
    name: str
    path: Path
    verifier: str
    languages: list[str]  # the languages it is made for: a set, their order means nothing (best_for_language)
    role: str  # "base" | "finetuned" | "from-scratch" | "multilingual" | "unknown"
    parent: str | None
    checksums: dict[str, str]
    provenance: dict[str, Any] = field(default_factory=dict)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_entry(cls, entry: dict[str, Any], path: Path) -> ShippedDraft:
        """A draft from a manifest entry; ``path`` is its directory."""
        languages = entry.get("languages") or []
        if not isinstance(languages, list) or not all(isinstance(x, str) for x in languages):
            raise InvalidInput(f"malformed draft entry for {path}: 'languages' must be a list of language codes, "
                               f"not {languages!r}")
        try:
            return cls(
                name=str(entry["name"]), path=path, verifier=str(entry.get("verifier") or "unknown"),
                languages=normalize_languages(languages), role=str(entry.get("role") or "unknown"),
                parent=entry.get("parent"), checksums=dict(entry.get("checksums") or {}),
                provenance=dict(entry.get("provenance") or {}), evaluations=list(entry.get("evaluations") or []),
            )
        except UnknownLanguage as exc:
            raise InvalidInput(f"malformed draft entry for {path}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"malformed draft entry for {path}: {exc!r}") from None

    def to_entry(self) -> dict[str, Any]:
        """The one-entry manifest written beside a pulled or pushed draft."""
        return {"name": self.name, "verifier": self.verifier, "languages": list(self.languages), "role": self.role,
                "parent": self.parent, "checksums": dict(self.checksums), "provenance": dict(self.provenance),
                "evaluations": list(self.evaluations)}

    def verify(self) -> None:
        """Raise unless every file matches its recorded sha256 (DraftNotFound when the weights are absent)."""
        if not (self.path / WEIGHTS_FILE).is_file():
            raise DraftNotFound(f"draft {self.name}: {self.path / WEIGHTS_FILE} is missing; "
                                f"install it with `{pull_command(self.name)}`")
        problems = verify_tree(self.path, self.checksums)
        if problems:
            raise ShippedDraftError(f"shipped draft {self.name} is damaged: " + "; ".join(problems),
                                    hint=f"fetch it again: {pull_command(self.name)}")


def read_entries(manifest: Path) -> list[dict[str, Any]]:
    """The entries of a manifest: an index ``{"drafts": [...]}`` or one entry ``{"name": ...}``."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read draft manifest {manifest}: {exc}") from None
    entries = data.get("drafts") if isinstance(data, dict) and "drafts" in data else [data]
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e for e in entries):
        raise InvalidInput(f"{manifest} is not a draft manifest (expected {{'drafts': [...]}} or one entry with 'name')")
    return entries


def entry_dir(root: Path, entry: dict[str, Any]) -> Path:
    """The directory of an index entry under ``root``; a ``dir`` that leaves ``root`` is refused."""
    return root / check_draft_name(str(entry.get("dir") or entry["name"]))


def checkout_drafts(verifier: str | None = None, manifest: Path = MANIFEST) -> list[ShippedDraft]:
    """The drafts the checkout's manifest lists (whether or not their weights are present)."""
    if not manifest.is_file():
        return []
    drafts = [ShippedDraft.from_entry(e, entry_dir(manifest.parent, e)) for e in read_entries(manifest)]
    return [d for d in drafts if verifier is None or d.verifier == verifier]


def _pulled(path: Path) -> ShippedDraft | None:
    if not (path / ENTRY_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        return None  # e.g. a training run's durable copy: no manifest entry, not a shipped draft
    entries = [e for e in read_entries(path / ENTRY_FILE) if e.get("name") == path.name]
    return ShippedDraft.from_entry(entries[0], path) if entries else None


def pulled_drafts(verifier: str | None = None, home: str | Path | None = None) -> list[ShippedDraft]:
    """The drafts installed by ``polyspec models pull`` under POLYSPEC_HOME/drafts."""
    root = drafts_home(home)
    found: list[ShippedDraft] = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.is_dir() or not _NAME.fullmatch(path.name):
            continue  # hidden staging directories of an install in progress
        try:
            draft = _pulled(path)
        except InvalidInput as exc:  # one bad directory must not hide the others
            log.warning("skipping %s: %s", path, exc)
            continue
        if draft is not None and (verifier is None or draft.verifier == verifier):
            found.append(draft)
    return found


def shipped_drafts(verifier: str | None = None, manifest: Path = MANIFEST,
                   home: str | Path | None = None) -> list[ShippedDraft]:
    """The drafts available here (for one verifier when given), parents before children.

    The checkout's drafts whose weights are present come first; then pulled drafts of other names.
    """
    drafts = [d for d in checkout_drafts(verifier, manifest) if (d.path / WEIGHTS_FILE).is_file()]
    names = {d.name for d in drafts}
    drafts += [d for d in pulled_drafts(verifier, home) if d.name not in names]
    return _parents_first(drafts)


def _parents_first(drafts: list[ShippedDraft]) -> list[ShippedDraft]:
    """The same drafts, order kept except that a listed parent is moved before its children."""
    by_name = {d.name: d for d in drafts}
    out: list[ShippedDraft] = []
    seen: set[str] = set()

    def visit(draft: ShippedDraft) -> None:
        if draft.name in seen:
            return
        seen.add(draft.name)  # before the parent: a parent cycle ends here instead of recursing forever
        if draft.parent in by_name:
            visit(by_name[draft.parent])
        out.append(draft)

    for draft in drafts:
        visit(draft)
    return out


def find_draft(name: str, *, home: str | Path | None = None, manifest: Path = MANIFEST) -> ShippedDraft:
    """The draft called ``name``: in the checkout (models/drafts), else in POLYSPEC_HOME/drafts/<name>.

    Raises :class:`DraftNotFound`, whose message says how to obtain it, when it is in neither.
    """
    check_draft_name(name)
    listed = next((d for d in checkout_drafts(None, manifest) if d.name == name), None)
    if listed is not None and (listed.path / WEIGHTS_FILE).is_file():
        return listed
    pulled = _pulled(drafts_home(home) / name)
    if pulled is not None:
        return pulled
    where = f"not in this checkout ({manifest.parent})" if manifest.is_file() else "not in a source checkout"
    raise DraftNotFound(f"draft {name!r} is {where} nor in {drafts_home(home) / name}; "
                        f"install it with `{pull_command(name)}`")


def measured_acceptance(evaluations: Iterable[Mapping[str, Any]], language: str,
                        benchmark: str | None = None) -> float | None:
    """The best mean acceptance length over all answers recorded for ``language`` (on ``benchmark`` when
    given), or None when there is no such measurement. Rows are manifest or registry evaluations."""
    found = [float(e["mean_acceptance_length"]) for e in evaluations
             if e.get("language") == language and (e.get("subset") or "all") == "all"
             and (benchmark is None or e.get("benchmark") == benchmark)]
    return max(found) if found else None


def common_benchmark(evaluation_lists: Iterable[Iterable[Mapping[str, Any]]], language: str) -> str | None:
    """The benchmark on which most of the given drafts were measured on ``language`` (ties: by name), so that
    drafts are compared on the same prompts where they can be."""
    counts: dict[str, int] = {}
    for evaluations in evaluation_lists:
        for name in {e.get("benchmark") for e in evaluations if e.get("language") == language}:
            if name:
                counts[name] = counts.get(name, 0) + 1
    return min(counts, key=lambda b: (-counts[b], b)) if counts else None


def best_for_language(drafts: Iterable[ShippedDraft], language: str, *,
                      specialist: bool = False) -> ShippedDraft | None:
    """Of the drafts made for ``language`` (it is among their ``languages``), the one with the highest measured
    acceptance on it, on the benchmark most of them share; unmeasured ones come after measured ones, and
    among equals a draft for fewer languages first. ``specialist``: only drafts made for that language alone."""
    made_for = [d for d in drafts if language in d.languages and (not specialist or set(d.languages) == {language})]
    bench = common_benchmark((d.evaluations for d in made_for), language)

    def rank(item: tuple[int, ShippedDraft]) -> tuple[bool, float, int, int]:
        i, draft = item
        mal = measured_acceptance(draft.evaluations, language, bench)
        return (mal is None, -(mal or 0.0), len(draft.languages), i)

    return min(enumerate(made_for), key=rank)[1] if made_for else None


def shipped_for_language(verifier: str, language: str, home: str | Path | None = None, *,
                         specialist: bool = False) -> ShippedDraft | None:
    """The available draft that serves ``language`` best (:func:`best_for_language`), if any."""
    return best_for_language(shipped_drafts(verifier, home=home), language, specialist=specialist)
