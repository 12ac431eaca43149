"""Bounded views of client text: what classification may read of a prompt of any size.

A prompt can be megabytes long and shaped to hurt (40,000 newlines, an '@' every other character).
Everything that classifies text reads only its head and tail through `head_and_tail`, so its cost is
bounded by a constant, not by the body a client chose to send.
"""

from __future__ import annotations

WINDOW = 4000  # characters read from each end of a text


def head_and_tail(text: str, size: int = WINDOW) -> str:
    """``text`` when it is at most ``2 * size`` characters; else its first and last ``size``, joined by a
    newline (so no token or line spans the cut)."""
    if len(text) <= 2 * size:
        return text
    return text[:size] + "\n" + text[-size:]
