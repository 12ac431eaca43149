"""Build, save and load speculators-format Eagle3 drafts for a verifier.

A draft is a real `speculators.models.eagle3.Eagle3DraftModel`. Its draft vocabulary is a sorted
subset of the verifier's token ids: ``d2t[i]`` is the offset ``target_id - i`` and ``t2d`` the
boolean mask over the verifier vocabulary (exactly speculators' own layout), and its frozen
``lm_head`` is the verifier's lm_head rows selected by ``t2d``. The saved checkpoint leaves out
``embed_tokens``: vLLM then shares the verifier's embedding (``_maybe_share_embeddings``), and
`load_draft` re-attaches it from the verifier, which keeps an 8k-vocab draft around 20 MB.
"""

from __future__ import annotations

from polyspec.core.errors import InvalidInput

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polyspec.core.atomic import atomic_dir

if TYPE_CHECKING:  # torch and speculators load lazily: importing this module stays cheap
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

DEFAULT_SAVE_DTYPE = "bfloat16"
WEIGHTS_FILE = "model.safetensors"


class DraftBuildError(InvalidInput):
    """A draft cannot be built, saved or loaded (bad vocabulary, verifier mismatch, bad files)."""


def _verifier_dir(verifier: Any) -> Path:
    """Accept a path or anything with a ``.path`` (models.verifiers.VerifierInfo)."""
    path = Path(getattr(verifier, "path", verifier)).expanduser()
    if not (path / "config.json").is_file():
        raise DraftBuildError(f"verifier directory {path} has no config.json")
    return path


def vocab_mappings(token_ids: Sequence[int], target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for a draft vocabulary, in speculators' layout: ``target_id = i + d2t[i]``."""
    import torch

    ids = sorted(int(t) for t in token_ids)
    if not ids:
        raise DraftBuildError("the draft vocabulary is empty")
    if len(set(ids)) != len(ids):
        raise DraftBuildError("the draft vocabulary holds duplicate token ids")
    if ids[0] < 0 or ids[-1] >= target_vocab_size:
        raise DraftBuildError(
            f"draft token ids must lie in [0, {target_vocab_size}); got {ids[0]}..{ids[-1]}"
        )
    selected = torch.tensor(ids, dtype=torch.long)
    d2t = selected - torch.arange(len(ids), dtype=torch.long)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return d2t, t2d


def _quiet_speculators() -> None:
    # speculators logs every file lookup through loguru; a tied lm_head is normal here, not a warning.
    from loguru import logger

    logger.disable("speculators")


def _verifier_weights(verifier_path: Any) -> dict[str, torch.Tensor]:
    from speculators.utils.loading import load_model_layers

    _quiet_speculators()
    return load_model_layers(["embed_tokens.weight", "lm_head.weight"], str(_verifier_dir(verifier_path)))


def verifier_lm_head_weight(verifier_path: Any) -> torch.Tensor:
    """The verifier's lm_head weight [vocab, hidden] (its embedding when the two are tied)."""
    weights = _verifier_weights(verifier_path)
    return weights.get("lm_head.weight", weights["embed_tokens.weight"])


def reslice_lm_head(model: Eagle3DraftModel, verifier_lm_head_weight: torch.Tensor, t2d: torch.Tensor) -> None:
    """Set the draft's frozen ``lm_head`` (and ``verifier_lm_head``) to the verifier rows selected by ``t2d``.

    speculators only fills these from the verifier when they are still NaN, so a draft whose
    vocabulary changed keeps stale rows unless they are re-sliced here.
    """
    import torch

    t2d = t2d.to(dtype=torch.bool, device="cpu")
    if t2d.shape[0] != verifier_lm_head_weight.shape[0]:
        raise DraftBuildError(
            f"t2d covers {t2d.shape[0]} tokens but the verifier lm_head has {verifier_lm_head_weight.shape[0]} rows"
        )
    rows = verifier_lm_head_weight.detach().to("cpu")[t2d]
    if rows.shape != model.lm_head.weight.shape:
        raise DraftBuildError(f"re-sliced lm_head {tuple(rows.shape)} != draft lm_head {tuple(model.lm_head.weight.shape)}")
    with torch.no_grad():
        for head in (model.lm_head, model.verifier_lm_head):
            head.weight.copy_(rows.to(device=head.weight.device, dtype=head.weight.dtype))
            head.weight.requires_grad_(False)


def _layer_config(verifier_dir: Path, num_layers: int) -> Any:
    from speculators.train.cli import create_transformer_layer_config

    # Full attention in every draft layer: the sliding-window default only matters past
    # max_model_len and would make the offline measurement and vLLM disagree there.
    return create_transformer_layer_config(
        verifier_name_or_path=str(verifier_dir),
        num_layers=num_layers,
        draft_arch="llama",
        hidden_act="silu",
        sliding_window=2048,
        full_attention_indices=list(range(num_layers)),
    )


def build_draft_model(
    verifier_path: Any,
    *,
    t2d_token_ids: Sequence[int],
    num_layers: int = 1,
    seed: int = 0,
    aux_layer_ids: Sequence[int] | None = None,
    k: int = 3,
    attn_impl: str = "sdpa",
) -> Eagle3DraftModel:
    """An in-memory, freshly initialised draft (speculators' eagle3 defaults: all three norms on)."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    if num_layers < 1 or k < 1:
        raise DraftBuildError(f"num_layers and k must be >= 1 (got {num_layers}, {k})")
    vdir = _verifier_dir(verifier_path)
    _quiet_speculators()
    layer_config = _layer_config(vdir, num_layers)
    d2t, t2d = vocab_mappings(t2d_token_ids, layer_config.vocab_size)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "target layers defaulted" warning is expected here
        try:
            model = Eagle3DraftModel.from_training_args(
                verifier_config=layer_config,
                t2d=t2d,
                d2t=d2t,
                verifier_name_or_path=str(vdir),
                target_layer_ids=list(aux_layer_ids) if aux_layer_ids is not None else None,
                draft_vocab_size=int(t2d.sum()),
                norm_before_residual=True,
                norm_before_fc=True,
                norm_output=True,
                ttt_steps=k,
                draft_attn_impl=attn_impl,
            )
        except ValueError as exc:
            raise DraftBuildError(str(exc)) from exc
    reslice_lm_head(model, verifier_lm_head_weight(vdir), t2d)
    return model


def create_draft(
    verifier_path: Any,
    out_dir: str | Path,
    *,
    t2d_token_ids: Sequence[int],
    num_layers: int = 1,
    seed: int = 0,
    aux_layer_ids: Sequence[int] | None = None,
    k: int = 3,
) -> Path:
    """Build an untrained draft for the verifier and save it (without embed_tokens) to ``out_dir``."""
    model = build_draft_model(
        verifier_path, t2d_token_ids=t2d_token_ids, num_layers=num_layers, seed=seed, aux_layer_ids=aux_layer_ids, k=k
    )
    return save_draft(model, out_dir)


def save_draft(
    model: Eagle3DraftModel, out_dir: str | Path, drop_embed_tokens: bool = True, dtype: str = DEFAULT_SAVE_DTYPE
) -> Path:
    """Save atomically: write a sibling temp dir, then rename it over ``out_dir``."""
    import torch

    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    skip = set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    state = {}
    for name, tensor in model.state_dict().items():
        if name in skip or (drop_embed_tokens and name.startswith("embed_tokens.")):
            continue
        t = tensor.detach().to("cpu")
        state[name] = t.to(torch_dtype) if t.is_floating_point() else t
    with atomic_dir(out) as tmp:
        model.config.dtype = torch_dtype
        model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        if not (tmp / WEIGHTS_FILE).is_file():
            raise DraftBuildError(f"save_pretrained wrote no {WEIGHTS_FILE} in {tmp}")
    return out


def load_draft(
    path: str | Path,
    verifier_path: Any,
    *,
    attn_impl: str = "sdpa",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Eagle3DraftModel:
    """Load a saved draft for training or offline evaluation.

    The config's recorded verifier path is replaced by ``verifier_path`` (drafts move between
    machines), embed_tokens comes from the verifier and lm_head is re-sliced by the draft's t2d.
    """
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    src = Path(path).expanduser()
    vdir = _verifier_dir(verifier_path)
    if not (src / "config.json").is_file() or not (src / WEIGHTS_FILE).is_file():
        raise DraftBuildError(f"{src} is not a saved draft (needs config.json and {WEIGHTS_FILE})")
    try:
        config = Eagle3SpeculatorConfig.from_pretrained(str(src))
    except Exception as exc:  # noqa: BLE001 - pydantic/json errors all mean "not a speculators eagle3 draft"
        raise DraftBuildError(f"{src}/config.json is not a speculators eagle3 config: {exc}") from exc
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001 - not serialized by HF
    config.speculators_config.verifier.name_or_path = str(vdir)
    _quiet_speculators()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Eagle3DraftModel.from_pretrained(str(src), config=config, dtype=torch.float32)
    if model.t2d is None:
        raise DraftBuildError(f"{src} has no draft vocabulary (t2d)")
    weights = _verifier_weights(vdir)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(weights["embed_tokens.weight"].to(model.embed_tokens.weight.dtype))
    reslice_lm_head(model, weights.get("lm_head.weight", weights["embed_tokens.weight"]), model.t2d)
    if dtype is not None or device is not None:
        model = model.to(device=device, dtype=dtype)
    return model.eval()
