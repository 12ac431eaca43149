"""Convert a GGUF checkpoint into a plain bf16 safetensors Hugging Face model directory.

transformers loads GGUF files but keeps the result GGUF-quantized (not serializable), so we ask it to
dequantize, rebuild a plain model from the config without ``quantization_config``, copy the weights
and save that. Heavy imports (torch, transformers) stay inside the function.
"""

from __future__ import annotations

from polyspec.core.errors import IntegrityError

from pathlib import Path

from polyspec.core.atomic import atomic_dir


class GgufConversionError(IntegrityError):
    """The GGUF file could not be turned into a usable Hugging Face model."""


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    """Write config.json, model.safetensors, tokenizer files and generation_config.json into ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    src_dir, name = str(gguf_path.parent), gguf_path.name
    quantized = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch_dtype, quantization_config=GgufConfig(gguf_file=name, dequantize=True)
    )
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    # The GGUF carries a training-run label as the model name; it would leak into every saved config.
    for key in ("_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config_dict["dtype"] = dtype
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # lm_head may be tied to the embeddings and then legitimately absent from either side.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise GgufConversionError(f"weights do not fit the architecture: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model = model.to(torch_dtype)
    model.generation_config = quantized.generation_config
    del quantized

    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    if not getattr(tokenizer, "chat_template", None):
        raise GgufConversionError(f"{gguf_path.name} carries no chat template; an instruct verifier needs one")

    # atomic_dir: a crash leaves no half-written model, and the files get normal modes (save_pretrained
    # writes weights 0600, which other users and containers of a shared POLYSPEC_HOME could not read)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
