"""A small bundled text sample per language (registry/data/{lang}.jsonl), read by ``add-language``.

The samples are NTREX-128 news sentences, one translation of the same English set in every language, so two
languages' vocabulary coverage is measured on the same content (registry/data/README.md: sources, licence,
how to rebuild). They ship in the wheel; nothing here reads the data pack at run time.
"""

from __future__ import annotations

from pathlib import Path

from polyspec.core.prompts import read_prompts
from polyspec.registry.errors import NotFound

SAMPLES_DIR = Path(__file__).resolve().parent / "data"


class NoSample(NotFound):
    """No bundled sample for a language: coverage needs the user's prompts instead."""


def sample_languages() -> list[str]:
    """The languages with a bundled sample, sorted."""
    return sorted(p.stem for p in SAMPLES_DIR.glob("*.jsonl"))


def has_sample(code: str) -> bool:
    return (SAMPLES_DIR / f"{code}.jsonl").is_file()


def read_sample(code: str) -> list[str]:
    """The sample of normalised language ``code``; :class:`NoSample` names the bundled ones."""
    if not has_sample(code):
        raise NoSample(f"no bundled text sample for {code!r} (bundled: {', '.join(sample_languages())}); "
                       f"give its prompts with `polyspec registry add-language {code} --prompts FILE`")
    return read_prompts(SAMPLES_DIR / f"{code}.jsonl")
