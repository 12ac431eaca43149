"""Request parsing and classification: which language and domain a request belongs to.

The language comes from, in order: the ``X-Polyspec-Language`` header, a ``polyspec.language`` body
field, or fastText langid on the last user message (chat) / the prompt (completions), with code blocks
and URLs stripped. Detection is restricted to the languages the routing table serves; a confidence
below the threshold sends the request to the default language, and its statistics go to the
undetermined bucket ``und`` (so uncertain prompts do not blur the default language's acceptance).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from polyspec.core.domains import detect_domain
from polyspec.core.langid import UNDETERMINED, LabelSet, allowed_labels, clean_for_langid, detect_cleaned
from polyspec.router.errors import BadRequest

ROUTER_BODY_KEY = "polyspec"
HEADER_PREFIX = "x-polyspec-"
_PIN = re.compile(r"[a-z0-9_.-]{1,32}")


@dataclass(frozen=True)
class Decision:
    language: str  # the language the request is routed under
    confidence: float  # langid confidence; 1.0 when pinned
    detected: str | None  # raw langid label (None when pinned)
    domain: str
    source: str  # "header" | "body" | "langid" | "fallback"
    text: str  # the text langid looked at (uncleaned), kept for opt-in capture

    @property
    def stats_language(self) -> str:
        """The language live stats count the request under: ``und`` when langid was not sure."""
        return UNDETERMINED if self.source == "fallback" else self.language


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (``json``'s reading of it), or a BadRequest that says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    except RecursionError:
        raise BadRequest("Request body is not acceptable JSON: nested too deeply.") from None
    except ValueError as exc:  # valid JSON Python will not read, e.g. an integer of more than 4300 digits
        raise BadRequest(f"Request body is not acceptable JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800): no engine can be sent that
        raise BadRequest("Request body is not acceptable JSON: a string holds a lone surrogate escape.") from None
    return body


def decode_body(raw: bytes) -> tuple[dict[str, Any], bool]:
    """The body and whether it is strict JSON (then `encode_body` may use msgspec for it).

    msgspec decodes strict JSON to exactly what ``json.loads`` gives, several times faster. What it
    refuses (NaN, lone surrogates, huge integers, deep nesting, errors) goes through `parse_json_body`,
    which keeps ``json``'s leniency and its error messages; such a body is re-encoded with ``json`` too.
    """
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.MsgspecError, RecursionError):
        return parse_json_body(raw), False
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    return body, True


def encode_body(body: Mapping[str, Any], strict: bool) -> bytes:
    if strict:
        return msgspec.json.encode(body)
    return json.dumps(body, ensure_ascii=False).encode()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "\n".join(t for p in content if isinstance(p, dict) and p.get("type") == "text"
                         and isinstance(t := p.get("text"), str))
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


def _pin(headers: Mapping[str, str], pins: Mapping[str, Any], what: str) -> str | None:
    """A client-pinned language or domain, normalised. It is echoed in response headers and metric labels,
    so anything but a short code (CR/LF, non-Latin-1, 10 kB) is a 400, not a broken response."""
    header = headers.get(f"{HEADER_PREFIX}{what}")
    code = str(header or pins.get(what) or "").strip().lower()
    if code and not _PIN.fullmatch(code):
        raise BadRequest(f"The pinned {what} must be a short code like 'fr' or 'code' (letters, digits, '_', '-', '.').",
                         param=f"X-Polyspec-{what.capitalize()}" if header else f"{ROUTER_BODY_KEY}.{what}")
    return code or None


def classify(
    body: Mapping[str, Any],
    kind: str,
    headers: Mapping[str, str],
    pins: Mapping[str, Any],
    served: Collection[str],
    default_language: str,
    threshold: float,
    max_chars: int,
    allowed: LabelSet | None = None,
) -> Decision:
    """``allowed``: `served` plus the default language as `allowed_labels` gives it (the router keeps
    one per routing table instead of rebuilding it per request)."""
    text = prompt_text(body, kind)
    domain = _pin(headers, pins, "domain") or detect_domain(text)
    pinned = _pin(headers, pins, "language")
    if pinned:
        return Decision(pinned, 1.0, None, domain, "header" if headers.get("x-polyspec-language") else "body", text)
    cleaned = clean_for_langid(text, max_chars=max_chars)
    if not cleaned.strip():
        return Decision(default_language, 0.0, None, domain, "fallback", text)
    guess = detect_cleaned(cleaned, allowed or allowed_labels(set(served) | {default_language}))
    if guess.confidence < threshold:
        return Decision(default_language, guess.confidence, guess.language, domain, "fallback", text)
    return Decision(guess.language, guess.confidence, guess.language, domain, "langid", text)
