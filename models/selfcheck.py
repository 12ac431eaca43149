"""The verifier's reference for the engine self-check, computed once with transformers and cached.

The reference is what the verifier itself says: greedy tokens and the top-5 at each position, in float32
on the CPU (the most accurate numerics available anywhere polyspec runs). polyspec.core.selfcheck holds
the prompts, the file format and the comparison; this module only computes and caches.

``python -m polyspec.models.selfcheck --verifier DIR`` makes sure the reference exists and prints its path:
the router's fleet runs it as a child process, so the router itself never imports torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from polyspec.core.atomic import atomic_write_json
from polyspec.core.errors import InvalidInput
from polyspec.core.selfcheck import (
    MAX_TOKENS,
    PROMPTS,
    TOP_K,
    Reference,
    ReferenceCase,
    load_reference,
    reference_key,
    reference_path,
)
from polyspec.core.settings import get_settings
from polyspec.models.hidden import load_verifier_model


def _home(home: Path | None) -> Path:
    if home is not None:
        return Path(home)

    return get_settings().home


def compute_reference(verifier: str | Path, prompts: Sequence[str] = PROMPTS, max_tokens: int = MAX_TOKENS,
                      top_k: int = TOP_K) -> Reference:
    """Greedy-decode each prompt (as a one-turn chat) with the verifier in float32, keeping the top-k ids."""
    import torch

    model, tokenizer = load_verifier_model(Path(verifier).expanduser(), device="cpu", dtype=torch.float32)
    cases = []
    with torch.inference_mode():
        for prompt in prompts:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            tokens, tops = _greedy(model, prompt_ids, max_tokens, top_k, _eos_ids(model, tokenizer))
            cases.append(ReferenceCase(prompt=prompt, prompt_ids=prompt_ids, tokens=tokens, top=tops,
                                       text=tokenizer.decode(tokens)))
    return Reference(key=reference_key(verifier, prompts, max_tokens, top_k), verifier=str(verifier),
                     max_tokens=max_tokens, top_k=top_k, cases=cases)


def _eos_ids(model: object, tokenizer: object) -> set[int]:
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(getattr(tokenizer, "eos_token_id", None))
    return {int(i) for i in ids if i is not None}


def _greedy(model: object, prompt_ids: list[int], max_tokens: int, top_k: int,
            eos: set[int]) -> tuple[list[int], list[list[int]]]:
    # A plain loop rather than generate(): no sampling defaults from generation_config.json, and the raw
    # logits' top-k at every step. It stops after an end-of-turn token: what follows one is noise that
    # numerics may flip freely (the engine is asked with ignore_eos, and only this prefix is compared).
    import torch

    out = model(torch.tensor([prompt_ids]), use_cache=True)  # type: ignore[operator]
    tokens: list[int] = []
    tops: list[list[int]] = []
    for _ in range(max_tokens):
        top = torch.topk(out.logits[0, -1].float(), top_k).indices.tolist()
        tokens.append(int(top[0]))
        tops.append([int(t) for t in top])
        if tokens[-1] in eos:
            break
        out = model(torch.tensor([[top[0]]]), past_key_values=out.past_key_values, use_cache=True)  # type: ignore[operator]
    return tokens, tops


def ensure_reference(verifier: str | Path, *, home: Path | None = None, prompts: Sequence[str] = PROMPTS,
                     max_tokens: int = MAX_TOKENS, top_k: int = TOP_K) -> tuple[Reference, Path]:
    """The cached reference for ``verifier`` (computed and written atomically when missing) and its path."""
    path = reference_path(_home(home), reference_key(verifier, prompts, max_tokens, top_k))
    try:
        cached = load_reference(path)
    except InvalidInput:  # a damaged cache file is recomputed and replaced
        cached = None
    if cached is not None:
        return cached, path
    reference = compute_reference(verifier, prompts, max_tokens, top_k)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, reference.to_json())
    return reference, path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyspec.models.selfcheck",
                                     description="Compute (or find) the engine self-check reference; print its path.")
    parser.add_argument("--verifier", required=True, help="Verifier model directory.")
    parser.add_argument("--home", type=Path, default=None, help="POLYSPEC_HOME (default: the settings').")
    args = parser.parse_args(argv)
    _, path = ensure_reference(args.verifier, home=args.home)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
