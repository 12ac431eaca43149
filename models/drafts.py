"""Read and validate speculators-format Eagle3 draft directories without torch.

Layout written by speculators 0.9 (``Eagle3DraftModel.save_pretrained``): ``config.json`` with
``speculators_model_type: "eagle3"``, ``architectures: ["Eagle3DraftModel"]``, a ``speculators_config``
(algorithm, proposal methods, verifier) and ``transformer_layer_config`` (whose ``vocab_size`` is the
verifier's vocabulary), plus ``model.safetensors`` holding ``d2t`` (int64 offsets, one per draft token:
``target_id = i + d2t[i]``) and ``t2d`` (bool mask over the target vocabulary). Only these two small
tensors are loaded (numpy); every other tensor is checked by shape from the header.
"""

from __future__ import annotations

from polyspec.core.errors import PolyspecError

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from polyspec.models.draft_build import DEFAULT_SAVE_DTYPE

if TYPE_CHECKING:
    from polyspec.models.verifiers import VerifierInfo

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


class DraftError(PolyspecError):
    """Base class of draft problems."""


class DraftInvalid(DraftError):
    """The directory is not a usable Eagle3 draft (for this verifier)."""


@dataclass
class DraftInfo:
    path: Path
    architecture: str
    verifier: str | None
    target_vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    num_layers: int
    k: int | None
    aux_layer_ids: list[int] | None
    has_embed_tokens: bool
    tensor_shapes: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("tensor_shapes")
        data["path"] = str(self.path)
        return data


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise DraftInvalid(f"draft directory {path} does not exist")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise DraftInvalid(f"{path} has no config.json; not a speculators draft")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DraftInvalid(f"{cfg} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DraftInvalid(f"{cfg} does not hold a JSON object")
    return data


def _weight_files(path: Path) -> list[Path]:
    index = path / WEIGHTS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise DraftInvalid(f"{index} is unreadable: {exc}") from exc
        files = [path / n for n in names]
    else:
        files = [path / WEIGHTS]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DraftInvalid(f"{path} lacks weight file(s): {', '.join(missing)}")
    return files


def _tensor_shapes(files: list[Path]) -> dict[str, tuple[Path, list[int]]]:
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[Path, list[int]]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="np") as st:
                for key in st.keys():
                    shapes[key] = (f, list(st.get_slice(key).get_shape()))
        except (SafetensorError, OSError, ValueError) as exc:
            raise DraftInvalid(f"{f} is not a readable safetensors file: {exc}") from exc
    return shapes


def _load_np(file: Path, key: str) -> np.ndarray:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="np") as st:
            return st.get_tensor(key)
    except (SafetensorError, OSError, ValueError) as exc:
        raise DraftInvalid(f"cannot read tensor {key} from {file}: {exc}") from exc


def _check_architecture(path: Path, cfg: dict[str, Any]) -> str:
    spec_cfg = cfg.get("speculators_config")
    if not isinstance(spec_cfg, dict):
        raise DraftInvalid(f"{path}/config.json has no speculators_config; not a speculators-format draft")
    kind = cfg.get("speculators_model_type") or spec_cfg.get("algorithm")
    if kind != "eagle3":
        raise DraftInvalid(f"{path} is a speculators {kind!r} model, not an eagle3 draft")
    arch = (cfg.get("architectures") or ["Eagle3DraftModel"])[0]
    if "eagle3" not in str(arch).lower():
        raise DraftInvalid(f"{path} declares architecture {arch!r}, expected an Eagle3 draft (Eagle3DraftModel)")
    return str(arch)


def _check_vocab(path: Path, shapes: dict[str, tuple[Path, list[int]]], target_vocab: int, draft_vocab: int) -> None:
    if "d2t" not in shapes or "t2d" not in shapes:
        if draft_vocab == target_vocab:
            return  # full vocabulary: no mapping needed
        raise DraftInvalid(f"{path}: draft vocab {draft_vocab} != target vocab {target_vocab} but d2t/t2d are missing")
    if shapes["d2t"][1] != [draft_vocab]:
        raise DraftInvalid(f"{path}: d2t has shape {shapes['d2t'][1]}, expected [{draft_vocab}] (draft_vocab_size)")
    if shapes["t2d"][1] != [target_vocab]:
        raise DraftInvalid(f"{path}: t2d has shape {shapes['t2d'][1]}, expected [{target_vocab}] (target vocab size)")
    t2d = _load_np(shapes["t2d"][0], "t2d").astype(bool)
    if int(t2d.sum()) != draft_vocab:
        raise DraftInvalid(f"{path}: t2d marks {int(t2d.sum())} tokens, expected {draft_vocab} (draft_vocab_size)")
    d2t = _load_np(shapes["d2t"][0], "d2t").astype(np.int64)
    targets = np.arange(draft_vocab, dtype=np.int64) + d2t
    if not np.array_equal(targets, np.flatnonzero(t2d)):
        raise DraftInvalid(f"{path}: d2t and t2d disagree (i + d2t[i] must list the ids marked in t2d, in order)")


def _check_shapes(path: Path, shapes: dict[str, tuple[Path, list[int]]], hidden: int, draft_vocab: int) -> None:
    lm_head = shapes.get("lm_head.weight")
    if lm_head is None:
        raise DraftInvalid(f"{path}: lm_head.weight is missing")
    if lm_head[1] != [draft_vocab, hidden]:
        raise DraftInvalid(f"{path}: lm_head.weight has shape {lm_head[1]}, expected [{draft_vocab}, {hidden}]")
    fc = shapes.get("fc.weight")
    if fc is None or fc[1][0] != hidden:
        raise DraftInvalid(f"{path}: fc.weight is missing or does not project to hidden size {hidden}")


def _check_against_verifier(path: Path, info: DraftInfo, verifier: VerifierInfo, target_hidden: int) -> None:
    if info.target_vocab_size != verifier.vocab_size:
        raise DraftInvalid(
            f"{path} was built for a {info.target_vocab_size}-token vocabulary; "
            f"verifier {verifier.name} has {verifier.vocab_size}"
        )
    if target_hidden != verifier.hidden_size:
        raise DraftInvalid(
            f"{path} expects verifier hidden size {target_hidden}; verifier {verifier.name} has {verifier.hidden_size}"
        )
    bad = [i for i in info.aux_layer_ids or [] if not 0 <= i < verifier.num_layers]
    if bad:
        raise DraftInvalid(f"{path}: aux layer ids {bad} lie outside verifier {verifier.name}'s {verifier.num_layers} layers")


def inspect_draft(path: str | Path, verifier: VerifierInfo | None = None) -> DraftInfo:
    """Validate a speculators Eagle3 draft directory (and its fit to ``verifier``); raise DraftInvalid if unusable."""
    path = Path(path).expanduser()
    cfg = _read_config(path)
    arch = _check_architecture(path, cfg)
    layer_cfg = cfg.get("transformer_layer_config")
    try:
        target_vocab = int(layer_cfg["vocab_size"])
        hidden = int(layer_cfg["hidden_size"])
        num_layers = int(layer_cfg["num_hidden_layers"])
        draft_vocab = int(cfg.get("draft_vocab_size") or target_vocab)
    except (TypeError, KeyError, ValueError) as exc:
        raise DraftInvalid(f"{path}/config.json: transformer_layer_config lacks vocab/hidden/layer sizes ({exc})") from exc
    shapes = _tensor_shapes(_weight_files(path))
    _check_shapes(path, shapes, hidden, draft_vocab)
    _check_vocab(path, shapes, target_vocab, draft_vocab)
    spec_cfg = cfg["speculators_config"]
    methods = spec_cfg.get("proposal_methods") or [{}]
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    info = DraftInfo(
        path=path.resolve(),
        architecture=arch,
        verifier=(spec_cfg.get("verifier") or {}).get("name_or_path"),
        target_vocab_size=target_vocab,
        draft_vocab_size=draft_vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        k=methods[0].get("speculative_tokens"),
        aux_layer_ids=[int(i) for i in aux] if aux else None,
        has_embed_tokens="embed_tokens.weight" in shapes,
        tensor_shapes={k: v[1] for k, v in shapes.items()},
    )
    if verifier is not None:
        _check_against_verifier(path, info, verifier, int(cfg.get("target_hidden_size") or hidden))
    return info


def load_t2d(path: str | Path) -> np.ndarray:
    """The draft's bool mask over the target vocabulary (all True for a full-vocabulary draft)."""
    info = inspect_draft(path)
    if "t2d" not in info.tensor_shapes:
        return np.ones(info.target_vocab_size, dtype=bool)
    files = _weight_files(info.path)
    for f in files:
        shapes = _tensor_shapes([f])
        if "t2d" in shapes:
            return _load_np(f, "t2d").astype(bool)
    raise DraftInvalid(f"{path}: t2d not found")  # unreachable after inspect_draft; kept for type checkers


def draft_token_ids(path: str | Path) -> list[int]:
    """Sorted target-vocabulary ids the draft can propose."""
    return [int(i) for i in np.flatnonzero(load_t2d(path))]


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
_PER_DRAFT_TOKEN = ("lm_head.weight", "verifier_lm_head.weight", "d2t")  # one row (entry) per draft-vocabulary token
_HEADER_SLACK = 256  # a larger vocabulary writes longer shapes and offsets into the safetensors header


def vocab_size_within(path: str | Path, max_bytes: int) -> int:
    """The largest draft vocabulary a draft shaped like the one at ``path`` can have with its weights files
    within ``max_bytes``. Growing the vocabulary adds one row to each tensor indexed by draft token (lm_head, d2t)
    and nothing else, so the size is the draft's other tensors plus the vocabulary times the bytes per token."""
    from safetensors import safe_open

    info = inspect_draft(path)
    files = _weight_files(info.path)
    per_token = 0
    for f in files:
        with safe_open(str(f), framework="np") as st:
            for key in st.keys():
                if key in _PER_DRAFT_TOKEN:
                    tensor = st.get_slice(key)
                    row = int(np.prod(tensor.get_shape()[1:], dtype=np.int64))
                    per_token += row * _DTYPE_BYTES.get(tensor.get_dtype(), 4)
    if not per_token:
        raise DraftInvalid(f"{info.path} has no lm_head.weight or d2t: its vocabulary size cannot be grown")
    fixed = sum(f.stat().st_size for f in files) - per_token * info.draft_vocab_size
    return _vocab_within(fixed, per_token, max_bytes)


def _vocab_within(fixed: int, per_token: int, max_bytes: int) -> int:
    return max(0, (max_bytes - fixed - _HEADER_SLACK) // per_token)


_SAVE_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}  # torch name -> safetensors code


def _verifier_text_config(verifier: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    """The verifier's config (a mapping, or read from DIR/config.json); a multimodal one's text_config."""
    if not isinstance(verifier, Mapping):
        cfg_path = Path(verifier).expanduser() / "config.json"
        try:
            verifier = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DraftError(f"verifier config {cfg_path} is unreadable: {exc}") from exc
    return verifier.get("text_config") or verifier  # type: ignore[union-attr]


def draft_tensor_shapes(verifier: Mapping[str, Any] | str | Path, draft_vocab_size: int, num_layers: int = 1,
                        dtype: str = DEFAULT_SAVE_DTYPE, num_aux: int = 3) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) of every tensor models.draft_build.save_draft writes for an Eagle3 draft of
    this verifier: the first decoder layer reads [embedding, hidden] (2 x hidden wide), the others hidden; the
    layer sizes are the verifier's (speculators' create_transformer_layer_config); embed_tokens is not saved."""
    text = _verifier_text_config(verifier)
    if dtype not in _SAVE_DTYPES:
        raise DraftError(f"draft dtype {dtype!r}: expected one of {', '.join(_SAVE_DTYPES)}")
    try:
        hidden, target_vocab, heads = int(text["hidden_size"]), int(text["vocab_size"]), int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        inter = int(text.get("intermediate_size") or 3 * hidden)
    except (KeyError, TypeError, ValueError) as exc:
        raise DraftError(f"verifier config lacks the sizes of a decoder ({exc})") from exc
    f = _SAVE_DTYPES[dtype]
    shapes = {"d2t": ("I64", [draft_vocab_size]), "t2d": ("BOOL", [target_vocab]),
              "lm_head.weight": (f, [draft_vocab_size, hidden]), "fc.weight": (f, [hidden, num_aux * hidden]),
              "input_norm.weight": (f, [num_aux * hidden]), "norm.weight": (f, [hidden])}
    for i in range(num_layers):
        width, layer = (2 * hidden if i == 0 else hidden), f"layers.{i}."
        shapes.update({
            layer + "self_attn.q_proj.weight": (f, [heads * head_dim, width]),
            layer + "self_attn.k_proj.weight": (f, [kv_heads * head_dim, width]),
            layer + "self_attn.v_proj.weight": (f, [kv_heads * head_dim, width]),
            layer + "self_attn.o_proj.weight": (f, [hidden, heads * head_dim]),
            layer + "mlp.gate_proj.weight": (f, [inter, hidden]), layer + "mlp.up_proj.weight": (f, [inter, hidden]),
            layer + "mlp.down_proj.weight": (f, [hidden, inter]),
            layer + "input_layernorm.weight": (f, [hidden]), layer + "post_attention_layernorm.weight": (f, [hidden]),
            **({layer + "hidden_norm.weight": (f, [hidden])} if i == 0 else {}),
        })
    return shapes


def predict_draft_bytes(verifier: Mapping[str, Any] | str | Path, draft_vocab_size: int, num_layers: int = 1,
                        dtype: str = DEFAULT_SAVE_DTYPE) -> int:
    """The size of the model.safetensors an Eagle3 draft of this verifier (its config, or its directory) with
    ``draft_vocab_size`` tokens and ``num_layers`` decoder layers saved in ``dtype`` will have: its tensors
    (:func:`draft_tensor_shapes`) and the safetensors header that lists them."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (code, shape) in sorted(draft_tensor_shapes(verifier, draft_vocab_size, num_layers, dtype).items()):
        size = int(np.prod(shape, dtype=np.int64)) * _DTYPE_BYTES[code]
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header_len = len(json.dumps(header, separators=(",", ":")))
    return 8 + header_len + (-header_len) % 8 + offset  # 8-byte length, the header padded to 8 bytes, the data


def max_draft_vocab(verifier: Mapping[str, Any] | str | Path, max_bytes: int, num_layers: int = 1,
                    dtype: str = DEFAULT_SAVE_DTYPE) -> int:
    """The largest draft vocabulary whose predicted weights file (:func:`predict_draft_bytes`) is within
    ``max_bytes`` (0 when not even the tensors independent of the vocabulary fit)."""
    one, two = (predict_draft_bytes(verifier, n, num_layers, dtype) for n in (1, 2))
    return _vocab_within(one - (two - one), two - one, max_bytes)
