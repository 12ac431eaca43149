"""Request parsing and classification: which language and domain a request belongs to.

The language comes from, in order: the ``X-Polyspec-Language`` header, a ``polyspec.language`` body
field, or fastText langid on the last user message (chat) / the prompt (completions), with code blocks
and URLs stripped. Detection is restricted to the languages the routing table serves; a confidence
below the threshold sends the request to the default language, and its statistics go to the
undetermined bucket ``und`` (so uncertain prompts do not blur the default language's acceptance).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from polyspec.core.domains import DOMAINS, detect_domain
from polyspec.core.languages import lookup_language
from polyspec.core.langid import UNDETERMINED, LabelSet, allowed_labels, clean_for_langid, detect_cleaned
from polyspec.router.body import prompt_text
from polyspec.router.body import pop_router_fields as body_pop_router_fields
from polyspec.router.errors import BadRequest

ROUTER_BODY_KEY = "polyspec"
HEADER_PREFIX = "x-polyspec-"
# A BCP 47-ish code: what a pin may look like before it is looked up (letters, digits, '-', '_', '.').
_PIN = re.compile(r"[A-Za-z0-9_.-]{1,35}")
OTHER = "other"  # the label of a pinned language the routing table does not serve


@dataclass(frozen=True)
class Decision:
    language: str  # the language the request is routed under
    confidence: float  # langid confidence; 1.0 when pinned
    detected: str | None  # raw langid label (None when pinned)
    domain: str
    source: str  # "header" | "body" | "langid" | "fallback"
    text: str  # the text langid looked at (uncleaned), kept for opt-in capture
    label: str = ""  # the bounded stats language (`stats_label`); "" means: the language itself

    @property
    def stats_language(self) -> str:
        """The language live stats and metrics count the request under (`stats_label`)."""
        return self.label or (UNDETERMINED if self.source == "fallback" else self.language)


def pop_router_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Remove the router's own body field; returns it (``{"language": .., "domain": ..}``)."""
    return body_pop_router_fields(body, ROUTER_BODY_KEY)


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers to forward: the client's, minus hop-by-hop ones and the router's own X-Polyspec-*.

    The body is re-serialised JSON, so its type and length are the router's to set.
    """
    drop = {"host", "content-length", "content-type", "connection", "keep-alive", "transfer-encoding",
            "accept-encoding", "upgrade"}
    kept = {k: v for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith(HEADER_PREFIX)}
    return kept | {"Content-Type": "application/json"}


def _pin_value(headers: Mapping[str, str], pins: Mapping[str, Any], what: str) -> tuple[str | None, str]:
    """(the pinned value or None, the param name to blame). A body pin must be a short string."""
    header = headers.get(f"{HEADER_PREFIX}{what}")
    if header is not None:
        return header, f"X-Polyspec-{what.capitalize()}"
    value = pins.get(what)
    param = f"{ROUTER_BODY_KEY}.{what}"
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"The pinned {what} must be a string, not {type(value).__name__}.", param=param)
    return value, param


def pinned_language(headers: Mapping[str, str], pins: Mapping[str, Any]) -> str | None:
    """A client-pinned language, normalised (``fra``, ``FR``, ``fr-CA`` -> ``fr``) and validated: it is echoed
    in response headers, and a code that is no ISO 639 language is a 400, never a new metric label."""
    value, param = _pin_value(headers, pins, "language")
    if value is None or not value.strip():
        return None
    if not _PIN.fullmatch(value.strip()):
        raise BadRequest("The pinned language must be a language code like 'fr', 'fra' or 'pt-BR'.", param=param)
    code = lookup_language(value)
    if code is None:
        raise BadRequest(f"The pinned language {value.strip()!r} is not an ISO 639 language code.", param=param)
    return code


def pinned_domain(headers: Mapping[str, str], pins: Mapping[str, Any], known: Collection[str]) -> str | None:
    """A client-pinned domain, lower-cased and validated against ``known`` (the built-in domains and those
    of the routing table)."""
    value, param = _pin_value(headers, pins, "domain")
    if value is None or not value.strip():
        return None
    code = value.strip().lower()
    if not _PIN.fullmatch(code) or code not in known:
        shown = code if _PIN.fullmatch(code) else "that value"
        raise BadRequest(f"The pinned domain {shown!r} is not one this router knows; known: "
                         f"{', '.join(sorted(known))}.", param=param)
    return code


def table_domains(table: Any) -> frozenset[str]:
    """The domains of a routing table's pools (kept with the table: it is rebuilt, never changed)."""
    domains = table.cached("domains")
    if domains is None:
        domains = table.cache("domains", frozenset(p.domain for p in table.pools))
    return domains


def stats_label(language: str, source: str, served: Collection[str]) -> str:
    """The language a request is counted under in metrics and live stats: ``und`` when langid was not sure,
    ``other`` for a pinned language no pool serves. So labels come from a bounded set: the languages of
    the routing table (and the default), ``und`` and ``other``, whatever clients send."""
    if source == "fallback":
        return UNDETERMINED
    return language if language in served else OTHER


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
    domains: Collection[str] = (),
) -> Decision:
    """``allowed``: `served` plus the default language as `allowed_labels` gives it (the router keeps
    one per routing table instead of rebuilding it per request). ``domains``: the routing table's domains,
    which a pin may name besides the built-in ones."""
    text = prompt_text(body, kind)
    domain = pinned_domain(headers, pins, {*DOMAINS, *domains}) or detect_domain(text)
    pinned = pinned_language(headers, pins)
    counted = {*served, default_language}
    if pinned:
        source = "header" if headers.get("x-polyspec-language") else "body"
        return Decision(pinned, 1.0, None, domain, source, text, stats_label(pinned, source, counted))
    cleaned = clean_for_langid(text, max_chars=max_chars)
    if not cleaned.strip():
        return Decision(default_language, 0.0, None, domain, "fallback", text, UNDETERMINED)
    guess = detect_cleaned(cleaned, allowed or allowed_labels(counted))
    if guess.confidence < threshold:
        return Decision(default_language, guess.confidence, guess.language, domain, "fallback", text, UNDETERMINED)
    return Decision(guess.language, guess.confidence, guess.language, domain, "langid", text,
                    stats_label(guess.language, "langid", counted))
