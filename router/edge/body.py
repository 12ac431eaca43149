"""Request bodies: decode, read the few fields the router needs, re-encode for the engine.

A body may be megabytes of JSON shaped to be expensive (100,000 messages, 150,000 content parts, a
prompt of 600,000 token ids). The router decodes only the top level, into ``msgspec.Raw`` slices: a
C-speed scan that builds no object per message or part. It then decodes just what it reads, from a
bounded number of items (the last ``MESSAGES_READ`` messages, the first and last ``PARTS_READ`` content
parts), and re-encodes the body by copying the untouched slices. The cost on the event loop is one
linear scan plus a constant; bench/hostile.py measures it for each shape. Earlier user turns, which
classification reads when the last one is short, are read the same way: at most `EARLIER_TURNS` of them,
from the same last `MESSAGES_READ` messages, and only the first `EARLIER_TURN_BYTES` of each.

What msgspec refuses (NaN, huge integers, deep nesting, lone surrogate escapes, invalid JSON) goes
through `parse_json_body`, which judges it with ``json``'s error messages; NaN, Infinity and -Infinity,
which ``json`` alone would accept, anywhere in the body, are refused like any other invalid JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from polyspec.router.errors import BadRequest

MESSAGES_READ = 64  # the last user message is looked for among this many messages from the end
PARTS_READ = 64  # text is taken from this many content parts at each end of a message
SMALL_FIELD_BYTES = 4096  # model, stream, stream_options, polyspec: no legitimate value is larger
EARLIER_TURNS = 4  # earlier user turns `Prompt.earlier_turns` reads, nearest first
EARLIER_TURN_BYTES = 8192  # of each, from its start: more prose than language ID reads (core.langid)

Body = dict[str, Any]  # top-level values are msgspec.Raw slices (strict bodies) or decoded values

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
# What a Raw slice would carry through unread, though Python (the router's json path, and vLLM) refuses it:
# a \uD800-\uDFFF escape (a lone one cannot be encoded) and an integer of more than 4,300 digits. A body
# holding either (or, harmlessly, a string that looks like one) takes json's path, which judges it. Both
# checks are linear C scans (about 1 ms per MB): a regex for long digit runs would backtrack.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_DIGITS_AS_ZERO = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_HUGE_INT = b"0" * 4300


def _needs_json_path(raw: bytes) -> bool:
    if b"\\u" in raw and _SURROGATE.search(raw) is not None:
        return True
    return _HUGE_INT in raw.translate(_DIGITS_AS_ZERO)


class _Message(msgspec.Struct):
    role: Any = None
    content: msgspec.Raw = msgspec.Raw(b"null")


class _Part(msgspec.Struct):
    type: Any = None
    text: Any = None


_NOTHING = object()
_MESSAGE = msgspec.json.Decoder(_Message)
_PART = msgspec.json.Decoder(_Part)


def _refuse_constant(name: str) -> float:
    """``json``'s hook for NaN, Infinity and -Infinity, which it would otherwise accept: no JSON standard
    has them, and an engine may refuse them or read them as something else."""
    raise BadRequest(f"Request body is not valid JSON: {name} is not a JSON number (JSON has no NaN or Infinity).")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999: re-encoded, it would become Infinity
        raise BadRequest(f"Request body is not acceptable JSON: the number {text[:40]} is too large.")
    return value


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (``json``'s reading of it), or a BadRequest that says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
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


def decode_body(raw: bytes) -> tuple[Body, bool]:
    """The body and whether it is strict JSON (its top-level values are then ``msgspec.Raw`` slices, and
    `encode_body` copies them); a non-strict body is fully decoded by `parse_json_body`."""
    if not _needs_json_path(raw):
        try:
            return _TOP.decode(raw), True
        except msgspec.ValidationError:  # valid JSON, but not an object
            raise BadRequest("Request body must be a JSON object.") from None
        except (msgspec.DecodeError, RecursionError):
            pass
    return parse_json_body(raw), False


def encode_body(body: Mapping[str, Any], strict: bool) -> bytes:
    if strict:
        return msgspec.json.encode(body)
    return json.dumps(body, ensure_ascii=False).encode()


def _decode(value: Any, what: str) -> Any:
    """A top-level value as Python (a Raw slice decoded; a value of a non-strict body as it is)."""
    if not isinstance(value, msgspec.Raw):
        return value
    if len(value) > SMALL_FIELD_BYTES:
        raise BadRequest(f"'{what}' is too large ({len(value)} bytes; at most {SMALL_FIELD_BYTES}).", param=what)
    return msgspec.json.decode(value)


def field(body: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A small top-level field (model, stream, stream_options, the router's own field), decoded."""
    value = body.get(name, default)
    return default if value is None else _decode(value, name)


def pop_router_fields(body: dict[str, Any], key: str) -> dict[str, Any]:
    """Remove the router's own body field ``key`` and return it; it must be an object when present."""
    fields = _decode(body.pop(key, None), key)
    if fields is None:
        return {}
    if not isinstance(fields, dict):
        raise BadRequest(f"'{key}' must be an object like {{\"language\": \"fr\"}}.", param=key)
    return fields


def _items(value: Any, what: str) -> list[Any]:
    """A JSON array as a list of Raw slices (strict) or values (non-strict); anything else is a 400."""
    if isinstance(value, msgspec.Raw):
        try:
            return _ITEMS.decode(value)
        except msgspec.ValidationError:
            pass
    elif isinstance(value, list):
        return value
    raise BadRequest(f"'{what}' must be an array.", param=what)


def _message(item: Any) -> tuple[Any, Any]:
    """(role, content) of one message: a Raw slice of a strict body, or a dict of a non-strict one."""
    if isinstance(item, msgspec.Raw):
        message = _MESSAGE.decode(item)
        return message.role, message.content
    if isinstance(item, dict):
        return item.get("role"), item.get("content")
    raise msgspec.ValidationError("not an object")


def _part_text(item: Any) -> str | None:
    if isinstance(item, msgspec.Raw):
        try:
            part = _PART.decode(item)
        except msgspec.ValidationError:
            return None
        kind, text = part.type, part.text
    elif isinstance(item, dict):
        kind, text = item.get("type"), item.get("text")
    else:
        return None
    return text if kind == "text" and isinstance(text, str) else None


def _content_text(content: Any) -> str:
    if isinstance(content, msgspec.Raw):
        if len(content) == 0 or memoryview(content)[0] not in b'"[':
            return ""
        content = msgspec.json.decode(content) if memoryview(content)[0] == ord('"') else _ITEMS.decode(content)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones, from both ends of a long list
        picked = content if len(content) <= 2 * PARTS_READ else content[:PARTS_READ] + content[-PARTS_READ:]
        return "\n".join(t for t in map(_part_text, picked) if t is not None)
    return ""


@dataclass(frozen=True)
class Prompt:
    """The text to classify, and the messages before it for `earlier_turns` (read only when asked)."""

    text: str
    earlier: tuple[Any, ...] = ()  # messages before the last user one, nearest first, within MESSAGES_READ

    def earlier_turns(self, turns: int = EARLIER_TURNS, turn_bytes: int = EARLIER_TURN_BYTES) -> list[str]:
        """The texts of up to ``turns`` earlier user messages, nearest first, each cut to its first
        ``turn_bytes`` (of JSON) without decoding the rest. A message of an odd shape is skipped: these
        turns are only hints, and the router never judged them before."""
        out: list[str] = []
        for item in self.earlier:
            if len(out) >= turns:
                break
            try:
                role, content = _message(item)
                if role == "user":
                    out.append(_turn_head(content, turn_bytes))
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
        return out


def _string_head(raw: bytes | msgspec.Raw, limit: int) -> str:
    """The start of a JSON string literal ``raw``: about its first ``limit`` bytes, decoded alone."""
    if len(raw) <= limit:
        return msgspec.json.decode(raw)
    head = bytes(memoryview(raw)[:limit])
    end = len(head)
    while end > 1 and head[end - 1] & 0xC0 == 0x80:  # not inside a UTF-8 sequence: drop a split character
        end -= 1
    if end > 1 and head[end - 1] >= 0xC0:
        end -= 1
    # Not inside an escape either (\uXXXX\uXXXX is the longest, 12 bytes): cut before any backslash run
    # that starts in the last 12 bytes.
    escape = head.find(b"\\", max(1, end - 12), end)
    if escape != -1:
        end = escape
        while end > 1 and head[end - 1] == 0x5C:
            end -= 1
    try:
        return msgspec.json.decode(head[:end] + b'"')
    except msgspec.DecodeError:  # a lone surrogate half left at the cut: drop the last escape too
        return msgspec.json.decode(head[:max(1, head.rfind(b"\\", 0, end))] + b'"')


def _turn_head(content: Any, limit: int) -> str:
    """An earlier turn's text, at most about ``limit`` bytes of it decoded: a string's head; of content parts,
    the text parts among the first `PARTS_READ` that fit in ``limit`` bytes (a larger part is skipped)."""
    if isinstance(content, msgspec.Raw):
        first = memoryview(content)[0] if len(content) else 0
        if first == ord('"'):
            return _string_head(content, limit)
        if first != ord("["):
            return ""
        content = [p for p in _ITEMS.decode(content)[:PARTS_READ] if len(p) <= limit]
    elif isinstance(content, list):
        content = content[:PARTS_READ]
    text = _content_text(content)
    return text[:limit]


def _chat_prompt(messages: list[Any]) -> Prompt:
    if not messages:
        raise BadRequest("'messages' is required and must be a non-empty array.", param="messages")
    last: Any = _NOTHING
    window = messages[-1:-MESSAGES_READ - 1:-1]
    for i, item in enumerate(window):
        try:
            role, content = _message(item)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise BadRequest("Each message must be an object.", param="messages") from None
        if role == "user":
            return Prompt(_content_text(content), tuple(window[i + 1:]))
        last = content if last is _NOTHING else last  # the last message's, if no user message is near the end
    return Prompt(_content_text(last))


def read_prompt(body: Mapping[str, Any], kind: str) -> Prompt:
    """The text to classify: the last user message (chat; among the last `MESSAGES_READ`, else the last
    message) or the prompt (completions; the last string of a list); for chat, with the messages before it.
    Also validates the fields the router itself depends on."""
    try:
        if kind == "chat":
            messages = body.get("messages")
            if messages is None:
                raise BadRequest("'messages' is required and must be a non-empty array.", param="messages")
            return _chat_prompt(_items(messages, "messages"))
        return Prompt(_completion_text(body.get("prompt")))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:  # a strict body's part of an odd shape
        raise BadRequest(f"Request body has an unexpected shape: {exc}.") from None


def prompt_text(body: Mapping[str, Any], kind: str) -> str:
    """`read_prompt`'s text alone."""
    return read_prompt(body, kind).text


def _completion_text(prompt: Any) -> str:
    if prompt is None:
        raise BadRequest("'prompt' is required.", param="prompt")
    if isinstance(prompt, msgspec.Raw):
        first = memoryview(prompt)[0] if len(prompt) else 0
        if first == ord('"'):
            return msgspec.json.decode(prompt)
        if first != ord("["):
            raise BadRequest("'prompt' must be a string or an array.", param="prompt")
        if b'"' not in bytes(prompt):  # a memcpy and a memchr
            return ""  # no string in it: token ids, which carry no text to classify (and are not decoded)
        prompt = _ITEMS.decode(prompt)
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):
        raise BadRequest("'prompt' must be a string or an array.", param="prompt")
    for item in reversed(prompt[-MESSAGES_READ:]):
        if isinstance(item, msgspec.Raw) and len(item) and memoryview(item)[0] == ord('"'):
            return msgspec.json.decode(item)
        if isinstance(item, str):
            return item
    return ""
