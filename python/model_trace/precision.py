"""What a run computed in, as a trace header's ``metadata.precision`` says it: the types of the
weights its matmuls read, of its activations and of its KV cache, and who says so. The Rust
runtime writes the same object (``Precision`` of trace-runtime); ``model-trace diff`` chooses its
default tolerance from the two headers' precisions (two runs on the same float weights agree to
float rounding, a run on quantized weights only to the quantization's noise).

Each type is named as ggml and the GGUF format name it, upper case (``Q4_K``, ``Q6_K``, ``F32``,
``F16``, ``BF16``). The keys:

==================== =====================================================================
``weights``          the matmuls' weight types: a GGUF's quantized types (``["Q4_K", "Q6_K"]``)
                     or one float type (``["F32"]``); always present (empty: not known)
``dequantized_from`` where the weights are floats dequantized from a quantized file, that
                     file's types; absent otherwise
``activations``      the activations' type (``F32``, ``BF16``), where known
``kv_cache``         the KV cache's type (``F16``, ``F32``), where the run has one
``source``           who says so: ``transformers``, ``torch``, ``llama.cpp``, ``the port``
==================== =====================================================================

The writers fill it in (:func:`model_trace.torch.trace`, :func:`model_trace.llama_cpp.run`);
:func:`record` makes one by hand, for a trace written with :class:`model_trace.writer.TraceWriter`
(``metadata={"precision": record(...)}``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

#: The keys of the record, in the order the Rust runtime writes them.
KEYS = ("weights", "dequantized_from", "activations", "kv_cache", "source")


def record(weights: Sequence[str], *, dequantized_from: Optional[Sequence[str]] = None,
           activations: Optional[str] = None, kv_cache: Optional[str] = None,
           source: Optional[str] = None) -> Dict[str, Any]:
    """The ``metadata.precision`` object: ``weights`` and each other key that is given
    (``dequantized_from`` where not empty), the types upper case."""
    made: Dict[str, Any] = {"weights": [str(w).upper() for w in weights]}
    if dequantized_from:
        made["dequantized_from"] = [str(t).upper() for t in dequantized_from]
    if activations is not None:
        made["activations"] = str(activations).upper()
    if kv_cache is not None:
        made["kv_cache"] = str(kv_cache).upper()
    if source is not None:
        made["source"] = str(source)
    return made


def merged(found: Mapping[str, Any], given: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """What a writer found, with what its caller says (``given``) on top: a given key replaces
    the found one (``{"dequantized_from": ["Q4_K", "Q6_K"]}`` adds what a tracer cannot see; a
    ``None`` value drops the key). A key that is not one of :data:`KEYS` is a ValueError."""
    unknown = sorted(set(given or {}) - set(KEYS))
    if unknown:
        raise ValueError(f"precision has the keys {', '.join(KEYS)}; not {', '.join(map(repr, unknown))}")
    values = {**found, **(given or {})}
    return record(values.get("weights") or [], **{key: values.get(key) for key in KEYS[1:]})
