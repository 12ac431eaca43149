"""Build the unseen-language prompt files (bench/data/unseen/LANG.jsonl) from the raw excerpts in raw/.

The raw excerpts are the upstream records used, copied field for field from pinned commits of public
repositories (README.md names each one). This script only formats them as prompts, drops exact duplicates
and writes one JSON object per line in the `{"prompt": ...}` form that `polyspec eval --bench` reads.

    .venv/bin/python bench/data/unseen/build.py          # rewrite the files
    .venv/bin/python bench/data/unseen/build.py --check  # exit 1 if a file differs from a fresh build
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
MAX_PROMPTS = 80

Record = dict[str, str]


def _norm(text: str) -> str:
    return unicodedata.normalize("NFC", text).strip()


def _xsid(lang: str, raw: str, source: str, licence: str) -> Iterator[Record]:
    """xSID test utterances (`# text:` lines, kept as id<TAB>text): spoken-assistant requests."""
    for line in (RAW / raw).read_text(encoding="utf-8").splitlines():
        uid, text = line.split("\t", 1)
        yield {"id": f"xsid-{lang}-{uid}", "lang": lang, "domain": "general", "category": "assistant",
               "prompt": _norm(text), "source": source, "license": licence}


def _squad(prefix: str) -> Callable[[str, str, str, str], Iterator[Record]]:
    """SQuAD-style paragraphs (XQuAD, HeQ): one prompt per question, the paragraph then the question."""

    def read(lang: str, raw: str, source: str, licence: str) -> Iterator[Record]:
        for line in (RAW / raw).read_text(encoding="utf-8").splitlines():
            para = json.loads(line)
            for qid, question in para["qas"]:
                yield {"id": f"{prefix}-{lang}-{qid}", "lang": lang, "domain": "reading", "category": "reading",
                       "prompt": _norm(para["context"]) + "\n\n" + _norm(question), "source": source,
                       "license": licence}

    return read


def _indicquest(lang: str, raw: str, source: str, licence: str) -> Iterator[Record]:
    """L3Cube-IndicQuest questions (CSV row<TAB>domain<TAB>question): open knowledge questions."""
    for line in (RAW / raw).read_text(encoding="utf-8").splitlines():
        row, domain, question = line.split("\t")
        yield {"id": f"indicquest-{lang}-{row}", "lang": lang, "domain": "general", "category": domain.lower(),
               "prompt": _norm(question), "source": source, "license": licence}


def _parsinlu_qqp(lang: str, raw: str, source: str, licence: str) -> Iterator[Record]:
    """ParsiNLU query-paraphrase pairs: q1, and q2 too when the pair is not a paraphrase (label 0)."""
    for n, line in enumerate((RAW / raw).read_text(encoding="utf-8").splitlines(), 1):
        pair = json.loads(line)
        for side in ("q1", "q2") if pair["label"] == "0" else ("q1",):
            yield {"id": f"parsinlu-{lang}-{n}-{side}", "lang": lang, "domain": "general",
                   "category": pair["category"], "prompt": _norm(pair[side]), "source": source, "license": licence}


def _zno(lang: str, raw: str, source: str, licence: str) -> Iterator[Record]:
    """ZNO exam tasks without a picture: the question, then its options one per line."""
    for line in (RAW / raw).read_text(encoding="utf-8").splitlines():
        task = json.loads(line)
        options = "\n".join(f"{key}) {_norm(text)}" for key, text in task["options"])
        yield {"id": f"zno-{lang}-{task['test']}-{task['task']}", "lang": lang, "domain": "general",
               "category": "exam", "prompt": _norm(task["question"]) + "\n" + options, "source": source,
               "license": licence}


# language -> (reader, raw excerpt, upstream repo@commit:path, licence)
SOURCES: dict[str, tuple[Callable[[str, str, str, str], Iterator[Record]], str, str, str]] = {
    "bn": (_indicquest, "bn_indicquest.tsv", "l3cube-pune/indic-nlp@e78ede5:L3Cube-IndicQuest/Bengali.csv",
           "CC-BY-NC-SA-4.0"),
    "da": (_xsid, "da_xsid.tsv", "mainlp/xsid@157d4ba:data/xSID-0.4/da.test.conll", "CC-BY-SA-4.0"),
    "fa": (_parsinlu_qqp, "fa_parsinlu_qqp.jsonl", "persiannlp/parsinlu@5c250d0:data/qqp/dev.jsonl",
           "CC-BY-NC-SA-4.0"),
    "he": (_squad("heq"), "he_heq.jsonl",
           "NNLP-IL/Hebrew-Question-Answering-Dataset@2a4fcd2:data/data v1.1/test v1.1.json", "CC-BY-4.0"),
    "ro": (_squad("xquad"), "ro_xquad.jsonl", "google-deepmind/xquad@60cac41:xquad.ro.json", "CC-BY-SA-4.0"),
    "ta": (_indicquest, "ta_indicquest.tsv", "l3cube-pune/indic-nlp@e78ede5:L3Cube-IndicQuest/Tamil.csv",
           "CC-BY-NC-SA-4.0"),
    "uk": (_zno, "uk_zno.jsonl", "NLPForUA/ZNO@c00b34e:tests/geography_raw.json", "CC-BY-NC-4.0"),
}


def build(lang: str) -> str:
    """The text of LANG.jsonl: unique prompts (case-insensitive) in upstream order, at most MAX_PROMPTS."""
    reader, raw, source, licence = SOURCES[lang]
    seen: set[str] = set()
    out: list[str] = []
    for rec in reader(lang, raw, source, licence):
        key = rec["prompt"].casefold()
        if key in seen:
            continue
        seen.add(key)
        out.append(json.dumps(rec, ensure_ascii=False))
        if len(out) == MAX_PROMPTS:
            break
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args(argv)
    stale = []
    for lang in SOURCES:
        path = HERE / f"{lang}.jsonl"
        text = build(lang)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{path.relative_to(HERE.parents[2])}: {text.count(chr(10))} prompts")
    if stale:
        print("stale (run bench/data/unseen/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
