"""The stages of a block class no family file knows, inferred from one pass.

``model_trace.torch`` records the first block's children as they are called (:class:`Call`);
:func:`infer` finds the norms, the attention and the MLP among them by name and class
(:func:`kind_of`), places each norm by where its values flow, and confirms the map with the
stage check on the same values. What cannot be placed is an :class:`InferenceError` naming it;
what can is an :class:`Architecture`, which :func:`architecture_source` prints to paste.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .. import stage_check
from .layouts import HEADS_FIRST, Architecture, StageSource

#: Module kinds a block's child can be, judged from its attribute name and class.
NORM, ATTENTION, MLP, IGNORED, UNKNOWN = "norm", "attention", "mlp", "ignored", "unknown"


def kind_of(name: str, class_name: str) -> str:
    """What a block's child is, from its name and class: a norm, the attention, the MLP (or
    MoE), a module without effect in eval mode (dropout, identity), or unknown."""
    lowered, cls = name.rsplit(".", 1)[-1].lower(), class_name.lower()
    if "dropout" in cls or cls == "identity":
        return IGNORED
    if "norm" in cls or re.search(r"(^|_)(ln|norm|layernorm|layer_norm)(_|\d|$)", lowered):
        return NORM
    if "attn" in lowered or "attention" in lowered or "attention" in cls:
        return ATTENTION
    if any(k in lowered for k in ("mlp", "ffn", "feed_forward", "moe", "experts")) or "mlp" in cls or "moe" in cls:
        return MLP
    return UNKNOWN


@dataclass
class Call:
    """One call of a block's child during the first pass: its path in the block, its class,
    its input's and output's values (float32, host memory), and when it started and returned
    (a count of the block's children's calls and returns: the order hooks would record in)."""

    path: str
    class_name: str
    input: Optional[np.ndarray]
    output: Optional[np.ndarray]
    started: int = 0
    finished: int = 0
    #: The output's layout: "heads_first" for [batch, heads, seq, head_dim], "" otherwise (set by
    #: whoever records the call, who knows the block's sequence length).
    layout: str = ""


class InferenceError(ValueError):
    """The stages of an unknown block class could not be placed."""


def _same(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(np.array_equal(a, b))


def infer(layer_class: str, layers: str, calls: Sequence[Call], block_input: np.ndarray, block_output: np.ndarray,
          attention_index: int = 1, logits: Optional[str] = None, residual_multiplier: float = 1.0) -> Architecture:
    """The architecture of blocks of class ``layer_class`` from one block's calls of its
    children, in call order: the norms, the attention and the MLP found by name and class,
    placed by where their values flow (a norm whose output is the attention's input is
    ``attn_in``; one whose input is the attention's output, ``attn_post_norm``; ...), then
    confirmed by the stage check on the same values. Raises :class:`InferenceError` naming what
    could not be placed, or the identity the inferred map breaks."""
    kinds = [(call, kind_of(call.path, call.class_name)) for call in calls]
    direct = [(c, k) for c, k in kinds if "." not in c.path]
    attentions = [c for c, k in direct if k == ATTENTION]
    mlps = [c for c, k in direct if k == MLP]
    problems = []
    if len(attentions) != 1:
        problems.append(f"{len(attentions)} attention submodules were called ({[c.path for c in attentions]}), not 1")
    if len(mlps) != 1:
        problems.append(f"{len(mlps)} MLP submodules were called ({[c.path for c in mlps]}), not 1")
    unknown = [f"{c.path} ({c.class_name})" for c, k in direct if k == UNKNOWN]
    if problems:
        raise InferenceError(_inference_message(layer_class, problems, unknown, calls))
    attention, mlp = attentions[0], mlps[0]
    # (when the hook would record it, stage, source): an output when its call returns, an input
    # when its call starts.
    stages: List[Tuple[int, str, StageSource]] = []
    unplaced = []
    for call, kind in direct:
        if kind != NORM:
            continue
        if _same(call.output, attention.input):
            stages.append((call.finished, "attn_in", (call.path, "output")))
        elif _same(call.output, mlp.input):
            if call.started > attention.started:
                stages.append((call.started, "resid_mid", (call.path, "input")))
            stages.append((call.finished, "mlp_in", (call.path, "output")))
        elif _same(call.input, attention.output):
            stages.append((call.finished, "attn_post_norm", (call.path, "output")))
        elif _same(call.input, mlp.output):
            stages.append((call.finished, "mlp_post_norm", (call.path, "output")))
        else:
            unplaced.append(f"{call.path} ({call.class_name}): its input is neither the attention's nor the MLP's "
                            "output, its output neither one's input")
    placed = {stage for _, stage, _ in stages}
    stages.append((attention.finished, "attn_out", (attention.path, "output")))
    stages.append((mlp.finished, "mlp_out", (mlp.path, "output")))
    attention_fed = next((c for c, k in direct if k == NORM and _same(c.output, attention.input)), None)
    if "mlp_in" not in placed and mlp.started > attention.started and not _same(mlp.input, block_input) \
            and not (attention_fed is not None and _same(mlp.input, attention_fed.output)):
        # No norm in front of the MLP (OLMo 2): it reads the residual stream itself.
        stages.append((mlp.started, "resid_mid", (mlp.path, "input")))
    for call, kind in kinds:
        if "." in call.path and kind == NORM and call.path.startswith(attention.path + "."):
            leaf = call.path.rsplit(".", 1)[-1].lower()
            stage = "q_norm" if leaf.startswith("q") else "k_norm" if leaf.startswith("k") else None
            if stage is not None:
                source = (call.path, "output", HEADS_FIRST) if call.layout == HEADS_FIRST else (call.path, "output")
                stages.append((call.finished, stage, source))
    if unplaced:
        raise InferenceError(_inference_message(layer_class, unplaced, unknown, calls))
    stages.sort(key=lambda s: s[0])
    architecture = Architecture(name=f"inferred:{layer_class}", layers=layers, layer_class=layer_class,
                                stages={stage: source for _, stage, source in stages},
                                attention=(attention.path, attention_index), logits=logits)
    values = {"input": block_input, "output": block_output}
    by_path = {c.path: c for c in calls}
    for stage, source in architecture.stages.items():
        call = by_path[source[0]]
        values[stage] = call.input if source[1] == "input" else call.output
    failures = [o for o in stage_check.check_layer(values, 0, residual_multiplier) if not o.passed]
    if failures:
        raise InferenceError(_inference_message(
            layer_class, [f"the inferred map {architecture_source(architecture)} breaks {f}" for f in failures],
            unknown, calls))
    return architecture


def _inference_message(layer_class: str, problems: Sequence[str], unknown: Sequence[str],
                       calls: Sequence[Call]) -> str:
    called = ", ".join(f"{c.path} ({c.class_name})" for c in calls)
    text = (f"model_trace.torch: blocks of class {layer_class} are of no known family, and their stages could not "
            f"be inferred from the first pass: " + "; ".join(problems) + f". Children called, in order: {called}.")
    if unknown:
        text += f" Not recognised as a norm, attention or MLP: {', '.join(unknown)}."
    return text + " Pass architecture=model_trace.torch.Architecture(...)."


def architecture_source(architecture: Architecture) -> str:
    """``Architecture(...)`` as Python source, to paste (only the fields that differ from the
    defaults)."""
    defaults = Architecture(name="", layers="")
    parts = []
    for f in dataclasses.fields(Architecture):
        value = getattr(architecture, f.name)
        if f.name in ("name", "layers") or value != getattr(defaults, f.name):
            parts.append(f"{f.name}={value!r}")
    return "Architecture(" + ", ".join(parts) + ")"
