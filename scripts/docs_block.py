"""The generated blocks of docs/ pages: a block is a list of lines whose first and last are its marks."""

from __future__ import annotations

from pathlib import Path


def replace_block(page: Path, block: list[str]) -> None:
    """Replace the block between ``block[0]`` and ``block[-1]`` in ``page``; append it when the marks are absent."""
    text = page.read_text(encoding="utf-8")
    new = "\n".join(block)
    begin, end = block[0], block[-1]
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + new + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    page.write_text(text, encoding="utf-8")
