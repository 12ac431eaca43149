"""Where artifacts live and whether they are intact: local directories or Hugging Face hub ids.

Heavy model code (models.drafts, models.verifiers) is imported lazily so the registry stays torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from polyspec.registry.errors import InvalidDraft, RegistryError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(location: str) -> bool:
    return not Path(location).expanduser().exists() and bool(_HUB_ID.match(location))


def materialize(location: str) -> Path:
    """A local directory holding the artifact: the directory itself, or the hub snapshot (cache first)."""
    path = Path(location).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise InvalidDraft(f"{location} is a file; a draft is a directory (config.json + model.safetensors)")
    if not is_hub_id(location):
        raise InvalidDraft(f"{location} is neither an existing directory nor a hub id (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(location, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: try the network once
        try:
            return Path(snapshot_download(location))
        except Exception as exc:  # noqa: BLE001
            raise InvalidDraft(f"cannot fetch {location} from the hub: {type(exc).__name__}: {exc}") from exc


# Side files a draft directory may carry that are not the draft: its model card and, once pulled, its own
# manifest entry. Both repeat the checksums, so hashing them would make every card edit a new draft version.
SIDE_FILES = ("README.md", "manifest.json")


def checksums(root: Path) -> dict[str, str]:
    from polyspec.models.checksums import sha256_tree

    return sha256_tree(root, exclude=SIDE_FILES)


def verify_checksums(root: Path, expected: dict[str, str]) -> list[str]:
    from polyspec.models.checksums import verify_tree

    return verify_tree(root, expected)


def verifier_info(row: Any):  # noqa: ANN201 - models.verifiers.VerifierInfo
    """A ``VerifierInfo`` built from a registry row, without touching the weights."""
    from polyspec.models.verifiers import VerifierInfo

    return VerifierInfo(
        name=row.name, path=Path(row.location), architecture=row.architecture, vocab_size=row.vocab_size,
        hidden_size=row.hidden_size, num_layers=row.num_layers, checksums=dict(row.checksums or {}),
    )


def inspect_draft(path: Path, verifier_row: Any):  # noqa: ANN201 - models.drafts.DraftInfo
    """Validate a draft against its verifier; any problem becomes ``InvalidDraft`` with the reason."""
    from polyspec.models.drafts import DraftError, inspect_draft as _inspect

    try:
        return _inspect(path, verifier_info(verifier_row))
    except DraftError as exc:
        raise InvalidDraft(f"{path}: {exc}") from exc
    except (OSError, ValueError, KeyError) as exc:  # unreadable files the inspector did not classify
        raise InvalidDraft(f"{path}: unreadable draft ({type(exc).__name__}: {exc})") from exc


def resolve_verifier(spec: str):  # noqa: ANN201 - models.verifiers.VerifierInfo
    from polyspec.models.verifiers import VerifierError, resolve_verifier as _resolve

    try:
        return _resolve(spec)
    except VerifierError as exc:
        raise RegistryError(f"cannot resolve verifier {spec!r}: {exc}") from exc
