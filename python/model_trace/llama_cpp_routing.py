"""llama.cpp's mixture-of-experts nodes read as ``router`` events (docs/trace-format.md), for
:mod:`model_trace.llama_cpp`.

Every MoE graph of llama.cpp routes in ``llm_graph_context::build_moe_ffn``
(``src/llama-graph.cpp`` of the llama.cpp llama-cpp-python 0.3.36 vendors), which names per
MoE layer ``N``:

=============================  ==========================================================
node                           what it holds
=============================  ==========================================================
``ffn_moe_logits-N``           the router logits ``[tokens, experts]``
``ffn_moe_probs-N``            their scores: softmax or sigmoid (``expert_gating_func``)
``ffn_moe_probs_biased-N``     scores plus the selection bias (``blk.N.exp_probs_b.bias``), where the GGUF has one
``ffn_moe_group_topk-N``       the chosen groups (grouped top-k; other groups masked with ``-inf``)
``ffn_moe_topk-N``             the chosen experts ``[tokens, k]`` (int32), best first
``ffn_moe_weights-N``          the chosen experts' unbiased scores
``ffn_moe_weights_norm-N``     those renormalised, where the graph does (``norm_w``: qwen3moe always,
                               deepseek2 by ``expert_weights_norm``)
``ffn_moe_weights_scaled-N``   times ``expert_weights_scale`` where it is not 0 or 1 (DeepSeek's
                               ``routed_scaling_factor``)
=============================  ==========================================================

The event's ``weights`` are the last of the three weights nodes the graph computed: what
multiplies each expert's output. Its scoring is the GGUF's ``<arch>.expert_gating_func`` (1
softmax, 2 sigmoid; absent: softmax, as llama.cpp takes it), checked on the first pass against
``ffn_moe_probs`` (a graph that gates otherwise, Llama 4's or GroveMoE's, is a warning); its
groups ``<arch>.expert_group_count`` and ``expert_group_used_count`` where the count is above 1
(llama.cpp groups only then); its bias the GGUF's ``blk.N.exp_probs_b.bias``, read from the file.
A gating function the record cannot name (3, softmax of the chosen weights; 4, sqrt-softplus)
records no router event, with a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import gguf_file

#: The nodes read per MoE layer.
ROUTER_NODES = frozenset({"ffn_moe_logits", "ffn_moe_probs", "ffn_moe_probs_biased", "ffn_moe_topk",
                          "ffn_moe_weights", "ffn_moe_weights_norm", "ffn_moe_weights_scaled"})
#: The weights nodes, the one computed last first: the final weights are the first present.
FINAL_WEIGHTS = ("ffn_moe_weights_scaled", "ffn_moe_weights_norm", "ffn_moe_weights")
#: ``expert_gating_func`` values the router record can say.
GATING = {1: "softmax", 2: "sigmoid"}
#: How far ``ffn_moe_probs`` may be from the scoring applied to ``ffn_moe_logits`` (float32).
SCORING_TOLERANCE = 1e-5

#: The tracepoint a llama.cpp trace's router events name.
TRACEPOINT = {"kind": "router", "name": "ffn_moe", "function": "llama_decode", "file": "", "line": 0}


class RouterWarning(UserWarning):
    """A llama.cpp router that is not recorded as the GGUF says (a gating function the record
    cannot name, scores that are not that gating of the logits)."""


@dataclass
class RouterRule:
    """How a GGUF's MoE layers choose their experts."""

    architecture: str
    #: ``expert_gating_func`` (0: absent).
    gating: int = 0
    #: ``(n_group, topk_group)`` of a grouped top-k.
    groups: Optional[Tuple[int, int]] = None
    #: The selection bias of each layer that has one.
    biases: Dict[int, np.ndarray] = field(default_factory=dict)
    #: The number of experts (0: a dense model).
    experts: int = 0
    #: Whether the scoring was checked against ``ffn_moe_probs`` (on the first layer read).
    checked: bool = False

    @property
    def scoring(self) -> Optional[str]:
        """``softmax`` or ``sigmoid``; None for a gating function the record cannot name."""
        return GATING.get(self.gating or 1)


def rule_of(path: str, architecture: str) -> RouterRule:
    """The routing of the GGUF at ``path`` (of llama.cpp architecture ``architecture``): its
    metadata keys, and each layer's selection bias read from the file (F32 vectors)."""
    info = gguf_file.read(path)
    meta = info.metadata

    def number(key: str) -> int:
        value = meta.get(f"{architecture}.{key}")
        return int(value) if isinstance(value, (int, float)) else 0

    rule = RouterRule(architecture, gating=number("expert_gating_func"), experts=number("expert_count"))
    count, used = number("expert_group_count"), number("expert_group_used_count")
    if count > 1:
        rule.groups = (count, used)
    for tensor in info.tensors:
        parts = tensor.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] == "exp_probs_b":
            if tensor.type != "F32":
                raise gguf_file.GgufError(f"{path}: {tensor.name} is {tensor.type}, not F32")
            rule.biases[int(parts[1])] = np.fromfile(path, dtype="<f4", count=int(np.prod(tensor.shape)),
                                                     offset=tensor.offset)
    return rule


def _scores(logits: np.ndarray, scoring: str) -> np.ndarray:
    x = logits.astype(np.float64)
    if scoring == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def write_router(writer: Any, values: Dict[Tuple[str, int], np.ndarray], layer: int, rule: RouterRule,
                 wants_capture: bool) -> None:
    """The router event of ``layer`` from the nodes read (``values``: (node, layer) -> array),
    when the layer is a MoE layer (it computed ``ffn_moe_logits``)."""
    logits = values.get(("ffn_moe_logits", layer))
    experts = values.get(("ffn_moe_topk", layer))
    weights = next((values[(name, layer)] for name in FINAL_WEIGHTS if (name, layer) in values), None)
    if logits is None or experts is None or weights is None:
        return
    scoring = rule.scoring
    if scoring is None:
        if not rule.checked:
            rule.checked = True
            warnings.warn(f"model_trace.llama_cpp: {rule.architecture}.expert_gating_func is {rule.gating}, which a "
                          "router event cannot name (softmax or sigmoid): no router events", RouterWarning,
                          stacklevel=3)
        return
    num_experts = logits.shape[-1]
    logits = logits.reshape(-1, num_experts)
    experts = experts.reshape(logits.shape[0], -1).astype(np.int64)
    weights = weights.reshape(logits.shape[0], -1)
    if not rule.checked:
        rule.checked = True
        probs = values.get(("ffn_moe_probs", layer))
        if probs is not None:
            error = float(np.max(np.abs(probs.reshape(logits.shape) - _scores(logits, scoring)), initial=0.0))
            if not error <= SCORING_TOLERANCE:
                warnings.warn(f"model_trace.llama_cpp: layer {layer}'s ffn_moe_probs are not the {scoring} of its "
                              f"ffn_moe_logits (max error {error:.3g}): the graph gates otherwise than "
                              f"{rule.architecture}.expert_gating_func says; its router events' margins are "
                              f"those of {scoring}", RouterWarning, stacklevel=3)
    bias = rule.biases.get(layer)
    writer.router(logits, experts, weights, layer, TRACEPOINT["name"], f"blk.{layer}", scoring, bias, rule.groups,
                  wants_capture, dtype="f32")
