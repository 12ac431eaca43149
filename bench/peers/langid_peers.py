"""Peer language identifiers, run inside .venv-bench by bench/langid.py (never imported by the product).

Reads a JSON file {"langs": [...], "texts": [...]} and prints one JSON object:
{system: {"pred": [label|null, ...], "seconds": float, "version": str}} for lingua (restricted to
``langs``), py3langid restricted to ``langs`` and py3langid unrestricted. One text per call, one thread:
the same way the router calls fastText.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version


def _timed(fn, texts):
    start = time.perf_counter()
    preds = [fn(t) for t in texts]
    return preds, time.perf_counter() - start


def run_lingua(langs, texts):
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    codes = [getattr(IsoCode639_1, c.upper()) for c in langs]
    detector = LanguageDetectorBuilder.from_iso_codes_639_1(*codes).with_preloaded_language_models().build()

    def one(text):
        lang = detector.detect_language_of(text)
        return None if lang is None else lang.iso_code_639_1.name.lower()

    preds, secs = _timed(one, texts)
    return {"pred": preds, "seconds": secs, "version": version("lingua-language-detector")}


def run_py3langid(langs, texts, restricted):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if restricted:
        ident.set_languages(list(langs))
    preds, secs = _timed(lambda t: ident.classify(t)[0], texts)
    return {"pred": preds, "seconds": secs, "version": version("py3langid")}


def main() -> None:
    spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
    langs, texts = spec["langs"], spec["texts"]
    out = {
        "lingua_restricted": run_lingua(langs, texts),
        "py3langid_restricted": run_py3langid(langs, texts, True),
        "py3langid_unrestricted": run_py3langid(langs, texts, False),
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
