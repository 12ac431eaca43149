"""Request parsing and classification: which language and domain a request belongs to.

The language comes from, in order: the ``X-Polyspec-Language`` header, a ``polyspec.language`` body
field, or language ID (core.langid: fastText, with lingua on short texts) on the last user message (chat)
/ the prompt (completions), with code blocks and URLs stripped. When the last user message is short and
language ID is not sure of it ("ok", "continue", "2"), earlier user turns of the conversation fill in
what the last one leaves open (`_with_earlier_turns`). Detection is restricted to the languages the
routing table serves; a confidence below the threshold sends the request to the default language, and
its statistics go to the undetermined bucket ``und`` (so uncertain prompts do not blur the default
language's acceptance). On a short text the decision keeps the labels language ID found likely
(``Decision.likely``), and the routing serves it with a draft that covers them (router.decision.routing).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from polyspec.core.domains import DOMAINS, detect_domain
from polyspec.core.languages import lookup_language
from polyspec.core.langid import (
    UNDETERMINED, LabelSet, LangGuess, allowed_labels, clean_for_langid, detect_cleaned,
)
from polyspec.router.edge.body import Prompt, read_prompt
from polyspec.router.edge.body import pop_router_fields as body_pop_router_fields
from polyspec.router.errors import BadRequest
from polyspec.router.table import RoutingTable

ROUTER_BODY_KEY = "polyspec"
HEADER_PREFIX = "x-polyspec-"
# A BCP 47-ish code: what a pin may look like before it is looked up (letters, digits, '-', '_', '.').
_PIN = re.compile(r"[A-Za-z0-9_.-]{1,35}")
OTHER = "other"  # the label of a pinned language the routing table does not serve
# A last user message shorter than this (cleaned; about 8 words) may take its language from earlier turns.
# A RouterConfig field would let operators set it; a constant until then.
SHORT_TURN_CHARS = 48


@dataclass(frozen=True)
class Decision:
    language: str  # the language the request is routed under
    confidence: float  # langid confidence; 1.0 when pinned
    detected: str | None  # raw langid label (None when pinned)
    domain: str
    source: str  # "header" | "body" | "langid" | "fallback"
    text: str  # the text langid looked at (uncleaned), kept for opt-in capture
    label: str = ""  # the bounded stats language (`stats_label`); "" means: the language itself
    # On a fallback from a short text: the labels language ID found likely, best first (`LangGuess.likely`).
    # The routing serves the request with a draft that covers them (router.decision.routing.unsure_pools).
    likely: tuple[str, ...] = ()

    @property
    def stats_language(self) -> str:
        """The language live stats and metrics count the request under (`stats_label`)."""
        return self.label or (UNDETERMINED if self.source == "fallback" else self.language)


def pop_router_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Remove the router's own body field; returns it (``{"language": .., "domain": ..}``)."""
    return body_pop_router_fields(body, ROUTER_BODY_KEY)


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


def stats_label(language: str, source: str, served: Collection[str]) -> str:
    """The language a request is counted under in metrics and live stats: ``und`` when langid was not sure,
    ``other`` for a pinned language no pool serves. So labels come from a bounded set: the languages of
    the routing table (and the default), ``und`` and ``other``, whatever clients send."""
    if source == "fallback":
        return UNDETERMINED
    return language if language in served else OTHER


def _with_earlier_turns(last: LangGuess | None, prompt: Prompt, allowed: LabelSet, max_chars: int) -> LangGuess | None:
    """The last turn's guess, completed by the earlier user turns of the conversation.

    The last turn keeps its confidence for its language; the earlier turns (read together, nearest first,
    within the same ``max_chars``: one more detection at most) share out the rest, ``1 - confidence``. So a
    short turn that is clearly French stays French after a long English conversation, and an "ok" after a
    French one reads as French. With no text in the last turn (code only), the earlier turns decide alone.
    """
    cleaned, budget = [], max_chars
    for turn in prompt.earlier_turns():
        if budget <= 0:
            break
        text = clean_for_langid(turn, max_chars=budget)
        if text:
            cleaned.append(text)
            budget -= len(text) + 1
    if not cleaned:
        return last
    context = detect_cleaned(" ".join(cleaned), allowed)
    if last is None:
        return context
    votes = {last.language: last.confidence}  # first: equal votes keep the last turn's language
    votes[context.language] = votes.get(context.language, 0.0) + (1.0 - last.confidence) * context.confidence
    language = max(votes, key=votes.__getitem__)
    return LangGuess(language, min(votes[language], 1.0))


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
    """``allowed``: `served` plus the default language as `allowed_labels` gives it. ``domains``: the routing
    table's domains, which a pin may name besides the built-in ones. The router calls `classify_for`, with the
    sets its routing table derived once."""
    counted = frozenset({*served, default_language})
    return _classify(body, kind, headers, pins, counted, default_language, threshold, max_chars,
                     allowed or allowed_labels(counted), frozenset({*DOMAINS, *domains}))


def classify_for(table: RoutingTable, body: Mapping[str, Any], kind: str, headers: Mapping[str, str],
                 pins: Mapping[str, Any], threshold: float, max_chars: int) -> Decision:
    """`classify` for the languages and domains of ``table`` (its known languages, the default included)."""
    return _classify(body, kind, headers, pins, table.known_languages, table.default_language, threshold, max_chars,
                     table.langid_labels, table.pin_domains)


def _classify(body: Mapping[str, Any], kind: str, headers: Mapping[str, str], pins: Mapping[str, Any],
              counted: Collection[str], default_language: str, threshold: float, max_chars: int, labels: LabelSet,
              pin_domains: Collection[str]) -> Decision:
    prompt = read_prompt(body, kind)
    text = prompt.text
    domain = pinned_domain(headers, pins, pin_domains) or detect_domain(text)
    pinned = pinned_language(headers, pins)
    if pinned:
        source = "header" if headers.get("x-polyspec-language") else "body"
        return Decision(pinned, 1.0, None, domain, source, text, stats_label(pinned, source, counted))
    cleaned = clean_for_langid(text, max_chars=max_chars)
    guess = detect_cleaned(cleaned, labels) if cleaned.strip() else None
    # Earlier turns can change the language only below 0.5 (they share out 1 - confidence), and the route
    # only below the threshold too: above both, they are not read.
    if len(cleaned) < SHORT_TURN_CHARS and (guess is None or guess.confidence < max(0.5, threshold)):
        guess = _with_earlier_turns(guess, prompt, labels, max_chars)
    if guess is None:
        return Decision(default_language, 0.0, None, domain, "fallback", text, UNDETERMINED)
    if guess.confidence < threshold:
        return Decision(default_language, guess.confidence, guess.language, domain, "fallback", text, UNDETERMINED,
                        guess.likely)
    return Decision(guess.language, guess.confidence, guess.language, domain, "langid", text,
                    stats_label(guess.language, "langid", counted))
