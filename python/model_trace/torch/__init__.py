"""Trace a PyTorch model with forward hooks: the reference side of ``model-trace diff``.

    import model_trace.torch
    with model_trace.torch.trace(model, "ref.ndjson"):
        model(**inputs)

Every forward call of ``model`` is a pass, which records the ``input_ids`` it consumes (its
``pass_begin`` event's ``tokens``); each transformer block a layer, with its input, its
output and the stages of the stage vocabulary (docs/trace-format.md) in between; attention
probabilities (when the model runs eager attention) and the next-token logits are recorded too.
The families of :mod:`model_trace.families` (Llama, Mistral, Mixtral, Qwen 2/3 and their MoE,
Gemma 1/2/3, Phi-3, OLMo 2, Granite, StarCoder 2, StableLM, Falcon, GPT-2, BERT) are detected from
their block class; the stages of another class are inferred from the first pass, with a warning
that prints the :class:`Architecture` to pass. On the first pass every layer's stages are
checked against the identities their names promise (:mod:`model_trace.stage_check`): a wrong
stage map raises :class:`StageMapError` instead of writing a trace that diffs wrong.

The package, one idea a module: :mod:`~model_trace.torch.tracing` (:func:`trace` and its hooks),
:mod:`~model_trace.torch.blocks` (the parts of a model that are hooked),
:mod:`~model_trace.torch.host` (device tensors copied to host memory),
:mod:`~model_trace.torch.first_pass_check` (the stage check as the layers end),
:mod:`~model_trace.torch.inference` (the stages of an unknown block class),
:mod:`~model_trace.torch.isolation` (each layer fed a port's captured input) and
:mod:`~model_trace.torch.precision` (the types the model computes in, for the header). Its modules import
the real ``torch`` (absolute imports: this package is ``model_trace.torch``). The names here
are re-exported: to change a module's setting (``host.ASYNC_COPY_DEVICES``, a test's stand-in
for ``host.to_numpy``), set it on the module that defines it, not on ``model_trace.torch``.
"""

from __future__ import annotations

from .. import families
from ..families import FAMILIES, HEADS_FIRST, Architecture
from ..families.name_maps import RESERVED, module_names
from ..stage_check import StageMapError
from .blocks import detect, first_tensor
from .host import DEVICE_ANALYSIS_MIN_ELEMENTS, analysed_on_device, to_numpy
from .tracing import trace

#: Every preset by family name (:data:`model_trace.families.FAMILIES` holds their variants too).
KNOWN = families.known()

# The family files' presets under their constant names (model_trace.torch.LLAMA), as
# model_trace.families exports them.
globals().update(families.PRESETS)

__all__ = ["DEVICE_ANALYSIS_MIN_ELEMENTS", "FAMILIES", "HEADS_FIRST", "KNOWN", "RESERVED", "Architecture",
           "StageMapError", "analysed_on_device", "detect", "first_tensor", "module_names", "to_numpy", "trace",
           *families.PRESETS]
