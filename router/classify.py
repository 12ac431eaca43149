"""Request parsing and classification: which language and domain a request belongs to.

The language comes from, in order: the ``X-Polyspec-Language`` header, a ``polyspec.language`` body
field, or fastText langid on the last user message (chat) / the prompt (completions), with code blocks
and URLs stripped. Detection is restricted to the languages the routing table serves; a confidence
below the threshold sends the request to the default language.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from router.errors import BadRequest

ROUTER_BODY_KEY = "polyspec"
HEADER_PREFIX = "x-polyspec-"

# Signals of source code in a prompt. Two or more distinct hits (or one fenced block) mean "code".
_FENCE = re.compile(r"```")
_CODE_SIGNALS = [
    re.compile(p, re.MULTILINE)
    for p in (
        r"^\s*(def|class)\s+\w+.*:\s*$",
        r"^\s*(import|from)\s+[\w.]+(\s+import\s+\w+)?\s*$",
        r"^\s*#include\s*[<\"]",
        r"\b(function|const|let|var)\s+\w+\s*[=(]",
        r"\bpublic\s+(static\s+)?(void|int|class|String)\b",
        r"[;{}]\s*$",
        r"\breturn\b[^\n]*;?\s*$",
        r"\b(printf|println|console\.log|System\.out)\s*\(",
        r"=>|==|!=|\+=|->|::",
        r"\b(SELECT|INSERT|UPDATE|DELETE)\b[\s\S]*\b(FROM|INTO|SET|WHERE)\b",
    )
]


@dataclass(frozen=True)
class Decision:
    language: str  # the language the request is routed and counted under
    confidence: float  # langid confidence; 1.0 when pinned
    detected: str | None  # raw langid label (None when pinned)
    domain: str
    source: str  # "header" | "body" | "langid" | "fallback"
    text: str  # the text langid looked at (uncleaned), kept for opt-in capture


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    return body


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def prompt_text(body: Mapping[str, Any], kind: str) -> str:
    """The text to classify; also validates the fields the router itself depends on."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required and must be a non-empty array.", param="messages")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("Each message must be an object.", param="messages")
        for message in reversed(messages):
            if message.get("role") == "user":
                return _content_text(message.get("content"))
        return _content_text(messages[-1].get("content"))
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("'prompt' is required.", param="prompt")
    if isinstance(prompt, list):
        texts = [p for p in prompt if isinstance(p, str)]
        return texts[-1] if texts else ""  # token-id prompts carry no text to classify
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string or an array.", param="prompt")
    return prompt


def detect_domain(text: str) -> str:
    if _FENCE.search(text):
        return "code"
    hits = sum(1 for pattern in _CODE_SIGNALS if pattern.search(text))
    return "code" if hits >= 2 else "general"


def pop_router_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Remove the router's own body field; returns it (``{"language": .., "domain": ..}``)."""
    fields = body.pop(ROUTER_BODY_KEY, None)
    return fields if isinstance(fields, dict) else {}


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers to forward: the client's, minus hop-by-hop ones and the router's own X-Polyspec-*.

    The body is re-serialised JSON, so its type and length are the router's to set.
    """
    drop = {"host", "content-length", "content-type", "connection", "keep-alive", "transfer-encoding",
            "accept-encoding", "upgrade"}
    kept = {k: v for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith(HEADER_PREFIX)}
    return kept | {"Content-Type": "application/json"}


def classify(
    body: Mapping[str, Any],
    kind: str,
    headers: Mapping[str, str],
    pins: Mapping[str, Any],
    served: Collection[str],
    default_language: str,
    threshold: float,
    max_chars: int,
) -> Decision:
    text = prompt_text(body, kind)
    domain = headers.get("x-polyspec-domain") or pins.get("domain") or detect_domain(text)
    domain = str(domain).strip().lower() or "general"
    pinned = headers.get("x-polyspec-language") or pins.get("language")
    if pinned:
        return Decision(str(pinned).strip().lower(), 1.0, None, domain, "header" if headers.get("x-polyspec-language") else "body", text)
    from models.langid import clean_for_langid, detect

    cleaned = clean_for_langid(text, max_chars=max_chars)
    if not cleaned.strip():
        return Decision(default_language, 0.0, None, domain, "fallback", text)
    guess = detect(cleaned, restrict=sorted(set(served) | {default_language}))
    if guess.confidence < threshold:
        return Decision(default_language, guess.confidence, guess.language, domain, "fallback", text)
    return Decision(guess.language, guess.confidence, guess.language, domain, "langid", text)
