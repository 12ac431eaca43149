"""`polyspec langid`: the core layer's command, language identification of standard input (core/langid.py,
core/langid_batch.py). Registered on the root CLI from here (polyspec/cli.py)."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from typing import BinaryIO, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyspec.core.langid_batch import detect_stream

MAX_LINE_BYTES = 1 << 20  # a line past this is read to its end but only its first MiB is identified


def _lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Lines of ``stream`` without their line ends, each at most ``limit`` bytes (the rest of a longer line is
    read and dropped, so one endless line cannot exhaust memory), decoded as UTF-8 with bad bytes replaced."""
    while line := stream.readline(limit):
        if len(line) == limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit)) and not rest.endswith(b"\n"):
                pass
        yield line.rstrip(b"\r\n").decode("utf-8", errors="replace")


def langid(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line, as each line is identified: "
                                 "{text, language, confidence}."),
    restrict: Optional[str] = typer.Option(None, help="Comma-separated labels to choose from, e.g. fr,en,de."),
    workers: int = typer.Option(1, min=1, max=64, help="Processes that identify lines (for large inputs: "
                                "language ID is CPU-bound, so each core needs its own process)."),
) -> None:
    """Identify the language of each line of standard input (fastText lid.176, with word frequencies and lingua
    on short lines; offline). Without --restrict, the first short line loads their models (a few seconds).

    Lines are read and answered as a stream (with --json), in input order, so input of any length runs in
    bounded memory; a line longer than 1 MiB is identified by its first MiB."""
    labels = [x.strip() for x in restrict.split(",") if x.strip()] if restrict else None
    if restrict is not None and not labels:
        typer.echo("error: --restrict needs at least one language code", err=True)
        raise typer.Exit(2)
    if as_json:
        lines, copy = itertools.tee(_lines(sys.stdin.buffer))
        for text, guess in zip(copy, detect_stream(lines, labels, workers)):
            sys.stdout.write(json.dumps({"text": text, "language": guess.language,
                                         "confidence": round(guess.confidence, 6)}, ensure_ascii=False) + "\n")
        return
    table = Table(title="Language identification (fastText lid.176 + word frequencies + lingua)")
    table.add_column("text", overflow="fold")
    table.add_column("language")
    table.add_column("confidence", justify="right")
    lines, copy = itertools.tee(_lines(sys.stdin.buffer))
    for text, guess in zip(copy, detect_stream(lines, labels, workers)):
        table.add_row(text[:80] + ("…" if len(text) > 80 else ""), guess.language, f"{guess.confidence:.3f}")
    Console().print(table)


def register(root: typer.Typer) -> None:
    """Mount `polyspec langid` on the root CLI."""
    root.command("langid")(langid)
