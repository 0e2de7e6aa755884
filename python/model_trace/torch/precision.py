"""What a PyTorch model computes in, as the header's ``metadata.precision`` records it
(:mod:`model_trace.precision`): read from the model's parameters and the autocast state when
:func:`model_trace.torch.trace` begins."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from .. import precision

#: torch's float types by the names ggml gives them.
_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}


def type_name(dtype: Any) -> str:
    """A torch dtype by ggml's name (``torch.bfloat16`` -> ``"BF16"``); another dtype by its
    own name, upper case (``torch.float8_e4m3fn`` -> ``"FLOAT8_E4M3FN"``)."""
    return _NAMES.get(dtype) or str(dtype).replace("torch.", "").upper()


def weight_types(model: Any) -> List[str]:
    """The float types of the model's matrices (its parameters of two or more dimensions: the
    linear layers' and the embeddings' weights), each once, sorted; of all its float
    parameters where it has no matrix. Norms kept in F32 in a BF16 model
    (``_keep_in_fp32_modules``) are vectors and do not count, as a GGUF's F32 norms do not."""
    floats = [p for p in model.parameters() if p.is_floating_point()]
    matrices = [p for p in floats if p.ndim >= 2] or floats
    return sorted({type_name(p.dtype) for p in matrices})


def activation_type(model: Any, weights: List[str]) -> Optional[str]:
    """The type the model computes in: autocast's, where autocast is on for the device of the
    model's parameters; else the weights' type where they have one; else unknown (None)."""
    first = next(iter(model.parameters()), None)
    # torch.get_autocast_dtype and is_autocast_enabled(device_type) came with torch 2.4.
    if first is not None and hasattr(torch, "get_autocast_dtype") and torch.is_autocast_enabled(first.device.type):
        return type_name(torch.get_autocast_dtype(first.device.type))
    return weights[0] if len(weights) == 1 else None


def of_model(model: Any, given: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The precision record of a trace of ``model``: ``weights`` (:func:`weight_types`),
    ``activations`` (:func:`activation_type`), ``kv_cache`` the activations' type for a model
    that generates (transformers' ``can_generate()``: its cache holds the keys and values as
    computed), ``source`` ``transformers`` for a transformers model, ``torch`` for another;
    ``given`` on top (:func:`model_trace.precision.merged`: ``{"dequantized_from": [...]}`` for
    a model loaded from a GGUF)."""
    weights = weight_types(model)
    activations = activation_type(model, weights)
    generates = getattr(model, "can_generate", None)
    found: Dict[str, Any] = {
        "weights": weights,
        "activations": activations,
        "kv_cache": activations if callable(generates) and generates() else None,
        "source": "transformers" if type(model).__module__.startswith("transformers.") else "torch",
    }
    return precision.merged(found, given)
