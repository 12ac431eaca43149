"""The one prompt reader. Registry (``add-language``), training (``polyspec train``) and evaluation
(``polyspec eval``) all read prompt and benchmark files through :func:`read_prompt_records`, so a file
one command accepts, every command accepts.

Accepted, one JSON object per line (blank lines skipped):
- ``{"prompt": "..."}``, optionally with the data pack's ``id``, ``lang``, ``domain``, ``category``;
- ``{"turns": ["...", "..."]}``: MT-Bench's multi-turn questions (user turns in order);
- ``{"text": "..."}``;
- ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (OpenAI chat): a trailing assistant turn
  is dropped, because the verifier writes the answers.
A file whose first non-blank line is not a JSON object is read as plain text, one prompt per line.
Every error names the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyspec.core.errors import InvalidInput, NotFoundError

# A prompts file is read into memory; beyond this it is almost certainly the wrong file.
MAX_FILE_BYTES = 2 * 1024**3
MAX_LINE_CHARS = 4 * 1024**2


class PromptsError(InvalidInput):
    """A prompts file that is missing, unreadable, malformed or empty."""


class PromptsNotFound(PromptsError, NotFoundError):
    exit_code = NotFoundError.exit_code


class NoPrompts(PromptsError):
    """A prompts file that holds nothing but blank lines."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: ``turns`` are the user turns in order; ``messages`` the conversation up to turn 1."""

    id: str
    turns: tuple[str, ...]
    messages: tuple[dict[str, str], ...]
    lang: str | None = None
    domain: str | None = None
    category: str | None = None
    where: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def text(self) -> str:
        """All user turns joined: what language ID and de-duplication look at."""
        return "\n\n".join(self.turns)


def _user_turns(messages: list[dict[str, str]]) -> tuple[str, ...]:
    return tuple(m["content"] for m in messages if m["role"] == "user")


def _from_messages(raw: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise PromptsError(f"{where}: 'messages' must be a list of {{role, content}} objects")
    msgs = []
    for m in raw:
        if not (isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)):
            raise PromptsError(f"{where}: every message needs a string 'role' and 'content'")
        msgs.append({"role": m["role"], "content": m["content"]})
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()
    if not msgs or msgs[-1]["role"] != "user" or not msgs[-1]["content"].strip():
        raise PromptsError(f"{where}: 'messages' must end with a non-empty user turn")
    return msgs


def _record(obj: Any, where: str, default_id: str) -> PromptRecord:
    if not isinstance(obj, dict):
        raise PromptsError(f"{where}: expected a JSON object")
    turns: tuple[str, ...]
    if "messages" in obj:
        messages = _from_messages(obj["messages"], where)
        turns = _user_turns(messages)
    else:
        if isinstance(obj.get("turns"), list):
            turns = tuple(t for t in obj["turns"] if isinstance(t, str) and t.strip())
            if len(turns) != len(obj["turns"]):
                raise PromptsError(f"{where}: every entry of 'turns' must be a non-empty string")
        elif isinstance(obj.get("prompt"), str):
            turns = (obj["prompt"],)
        elif isinstance(obj.get("text"), str):
            turns = (obj["text"],)
        else:
            raise PromptsError(f"{where}: no 'prompt', 'turns', 'text' or 'messages' field")
        turns = tuple(t.strip() for t in turns)
        if not turns or not all(turns):
            raise PromptsError(f"{where}: the prompt is empty")
        messages = [{"role": "user", "content": turns[0]}]
    known = {"id", "prompt", "turns", "text", "messages", "lang", "domain", "category", "question_id"}
    rid = obj.get("id", obj.get("question_id"))
    return PromptRecord(
        id=str(rid) if rid is not None and str(rid) else default_id,
        turns=turns,
        messages=tuple(messages),
        lang=obj["lang"] if isinstance(obj.get("lang"), str) else None,
        domain=obj["domain"] if isinstance(obj.get("domain"), str) and obj["domain"] else None,
        category=obj["category"] if isinstance(obj.get("category"), str) else None,
        where=where,
        extra={k: v for k, v in obj.items() if k not in known},
    )


def _is_json_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def read_prompt_records(path: str | Path) -> list[PromptRecord]:
    """Every prompt of a file, in file order. Raises :class:`PromptsError` naming the file and line."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise PromptsError(f"{p} is a directory, not a prompts file")
    if p.exists() and not p.is_file():  # a FIFO or device would block or never end
        raise PromptsError(f"{p} is not a regular file")
    if not p.is_file():
        raise PromptsNotFound(f"prompts file not found: {p}")
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise PromptsError(f"{p}: larger than {MAX_FILE_BYTES // 1024**3} GiB; split it")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptsError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise PromptsError(f"cannot read prompts file {p}: {exc.strerror or exc}") from None
    lines = text.split("\n")  # not splitlines(): JSON strings may hold U+2028 and friends
    numbered = [(i, ln) for i, ln in enumerate(lines, 1) if ln.strip()]
    if not numbered:
        raise NoPrompts(f"no prompts in {p} (expected JSONL with prompt/turns/text/messages, or one per line)")
    records: list[PromptRecord] = []
    as_json = _is_json_object(numbered[0][1])
    for lineno, line in numbered:
        where = f"{p}:{lineno}"
        if len(line) > MAX_LINE_CHARS:
            raise PromptsError(f"{where}: line longer than {MAX_LINE_CHARS:,} characters")
        if not as_json:
            records.append(PromptRecord(id=f"{p.stem}-{lineno}", turns=(line.strip(),),
                                        messages=({"role": "user", "content": line.strip()},), where=where))
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise PromptsError(f"{where}: not valid JSON ({exc.args[0] if exc.args else exc})") from None
        records.append(_record(obj, where, f"{p.stem}-{lineno}"))
    return records


def read_prompts(path: str | Path) -> list[str]:
    """The user-turn texts of a file, every turn of every record (what ``add-language`` profiles)."""
    return [t for rec in read_prompt_records(path) for t in rec.turns]
