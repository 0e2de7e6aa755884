"""The model families the PyTorch tracer knows: one declarative preset a family (where its
blocks are, which submodule's output or input is which stage), in the manner of
TransformerLens' ``supported_architectures`` adapters. Nothing here imports torch.

A preset is an :class:`Architecture`. The tracer picks the first preset of :data:`FAMILIES`
whose ``layer_class`` is the class of the model's blocks and whose ``when`` holds on the
model's config (variants of one block class whose forward depends on the config: Falcon,
StableLM); a class none of them names is inferred from one pass (:func:`infer`).

Stage names follow the stage vocabulary of docs/trace-format.md. Which family records which
stage (:func:`stage_table` prints it):

- pre-norm blocks (Llama, Mistral, Mixtral, Qwen 2/3 and their MoE, Gemma, Phi-3, Granite,
  StarCoder 2, GPT-2, sequential StableLM and Falcon): ``attn_in attn_out resid_mid mlp_in
  mlp_out``, Qwen 3 adding ``q_norm k_norm``;
- sandwich-norm blocks (Gemma 2, Gemma 3): ``attn_in attn_out attn_post_norm resid_mid mlp_in
  mlp_out mlp_post_norm``, Gemma 3 adding ``q_norm k_norm``;
- OLMo 2 (post-norms only): ``q_norm k_norm attn_out attn_post_norm resid_mid mlp_out
  mlp_post_norm``;
- parallel blocks (Falcon's new architecture and parallel attention, parallel StableLM):
  ``attn_in [mlp_in] attn_out mlp_out``, no ``resid_mid``;
- BERT (post-norm): ``attn_out resid_mid mlp_out``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import stage_check

#: A stage's tensor: (submodule path relative to the block, ``"output"`` or ``"input"``), and
#: optionally a layout: ``"heads_first"`` for a module that sees ``[batch, heads, seq, head_dim]``
#: (Gemma 3's q/k norms), recorded as ``[batch, seq, heads, head_dim]`` like the others.
StageSource = Tuple[str, ...]

#: The layout of a stage whose module sees the heads before the positions.
HEADS_FIRST = "heads_first"


@dataclass
class Architecture:
    """Where a model's blocks and stages are.

    ``layers``: a regex over ``named_modules()`` paths whose group 1 is the layer index.
    ``stages``: stage name -> (submodule path relative to the block, ``"output"`` or
    ``"input"``[, layout]), in execution order. ``attention``: (submodule, index of the
    probabilities in its output tuple). ``logits``: the head (absolute path): the logits
    recorded are the ones the model returns (after Gemma 2's soft-capping, Granite's scaling),
    the head's output only when the model returns none. ``layer_class``: the blocks' class.
    ``when``: config attribute -> value, all of which must hold for this preset to be chosen
    (variants of one block class). ``config_metadata``: config attributes written into the
    header's ``metadata.extra`` (Granite's ``residual_multiplier``, which the stage check reads).
    """

    name: str
    layers: str
    stages: Dict[str, StageSource] = field(default_factory=dict)
    attention: Optional[Tuple[str, int]] = None
    logits: Optional[str] = None
    layer_class: Optional[str] = None
    when: Dict[str, Any] = field(default_factory=dict)
    config_metadata: Tuple[str, ...] = ()

    def applies_to(self, config: Any) -> bool:
        """Whether ``when`` holds on ``config`` (a transformers config; its text config for a
        multimodal one). A preset without ``when`` applies to any."""
        if not self.when:
            return True
        configs = [config] + ([config.get_text_config()] if hasattr(config, "get_text_config") else [])
        for key, value in self.when.items():
            found = [getattr(c, key) for c in configs if c is not None and hasattr(c, key)]
            if not found or found[-1] != value:
                return False
        return True


#: The layer pattern of transformers' decoders (``model.layers.N``, also
#: ``model.language_model.layers.N`` inside a multimodal model).
LAYERS = r"^(?:.*\.)?layers\.(\d+)$"
#: GPT-2's and Falcon's (``transformer.h.N``).
H_LAYERS = r"^(?:.*\.)?h\.(\d+)$"

#: Llama's pre-norm block: ``input_layernorm``, ``self_attn``, residual add,
#: ``post_attention_layernorm`` (the pre-MLP norm), ``mlp``, residual add.
PRE_NORM_STAGES: Dict[str, StageSource] = {
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attn", "output"),
    "resid_mid": ("post_attention_layernorm", "input"),
    "mlp_in": ("post_attention_layernorm", "output"),
    "mlp_out": ("mlp", "output"),
}

def _with_qk_norms(stages: Mapping[str, StageSource], *layout: str) -> Dict[str, StageSource]:
    """``stages`` with the attention's query/key norms (``self_attn.q_norm``/``k_norm``) right
    after ``attn_in``, as they run; ``layout`` as in :data:`StageSource`."""
    with_norms: Dict[str, StageSource] = {}
    for stage, source in stages.items():
        with_norms[stage] = source
        if stage == "attn_in":
            with_norms["q_norm"] = ("self_attn.q_norm", "output", *layout)
            with_norms["k_norm"] = ("self_attn.k_norm", "output", *layout)
    return with_norms


#: The same with per-head query/key norms before RoPE (Qwen 3), seen as [batch, seq, heads, head_dim].
PRE_NORM_QK_STAGES = _with_qk_norms(PRE_NORM_STAGES)

#: Gemma 2's sandwich norms: ``post_attention_layernorm`` is the attention's post-norm, before
#: the residual add; ``pre_feedforward_layernorm`` the MLP's input norm.
SANDWICH_STAGES: Dict[str, StageSource] = {
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attn", "output"),
    "attn_post_norm": ("post_attention_layernorm", "output"),
    "resid_mid": ("pre_feedforward_layernorm", "input"),
    "mlp_in": ("pre_feedforward_layernorm", "output"),
    "mlp_out": ("mlp", "output"),
    "mlp_post_norm": ("post_feedforward_layernorm", "output"),
}


def _llama_like(name: str, layer_class: str, stages: Mapping[str, StageSource] = PRE_NORM_STAGES,
                **extra: Any) -> Architecture:
    return Architecture(name=name, layers=LAYERS, stages=dict(stages), attention=("self_attn", 1),
                        logits="lm_head", layer_class=layer_class, **extra)


#: Llama blocks (transformers' LlamaDecoderLayer): pre-norm.
LLAMA = _llama_like("llama", "LlamaDecoderLayer")
MISTRAL = _llama_like("mistral", "MistralDecoderLayer")
#: Mixtral: the MLP is the sparse MoE block (fused experts); mlp_out is its output.
MIXTRAL = _llama_like("mixtral", "MixtralDecoderLayer")
QWEN2 = _llama_like("qwen2", "Qwen2DecoderLayer")
#: Qwen 2 MoE: ``mlp`` is the MoE block (routed experts plus the gated shared expert), or a
#: dense MLP on ``mlp_only_layers``; either way mlp_out is its output.
QWEN2_MOE = _llama_like("qwen2_moe", "Qwen2MoeDecoderLayer")
QWEN3 = _llama_like("qwen3", "Qwen3DecoderLayer", PRE_NORM_QK_STAGES)
QWEN3_MOE = _llama_like("qwen3_moe", "Qwen3MoeDecoderLayer", PRE_NORM_QK_STAGES)
#: Gemma: Llama's block (norms scale by 1 + weight); layer 0's input is the embeddings times sqrt(hidden).
GEMMA = _llama_like("gemma", "GemmaDecoderLayer")
#: Phi-3: fused qkv_proj and gate_up_proj inside self_attn and mlp; the residual dropouts are
#: the identity in eval mode.
PHI3 = _llama_like("phi3", "Phi3DecoderLayer")
#: StarCoder 2: LayerNorms with bias, a c_fc/c_proj MLP.
STARCODER2 = _llama_like("starcoder2", "Starcoder2DecoderLayer")
#: Granite: both residual branches scaled by ``residual_multiplier`` (recorded in the header for
#: the stage check), the embeddings by ``embedding_multiplier``, the logits divided by ``logits_scaling``.
GRANITE = _llama_like("granite", "GraniteDecoderLayer", config_metadata=("residual_multiplier",))
GEMMA2 = _llama_like("gemma2", "Gemma2DecoderLayer", SANDWICH_STAGES)
#: Gemma 3 (Gemma3ForCausalLM, and the language model of Gemma3ForConditionalGeneration: the
#: vision tower's SiglipEncoderLayer blocks are not of this class): sandwich norms, per-head
#: q/k norms applied after the heads are moved first.
GEMMA3 = _llama_like("gemma3", "Gemma3DecoderLayer", _with_qk_norms(SANDWICH_STAGES, HEADS_FIRST))
#: OLMo 2: no pre-norms; post-norms on both branches; q/k norms over the whole projection
#: ([batch, seq, heads*head_dim]); the residual between the branches is the MLP's input.
OLMO2 = _llama_like("olmo2", "Olmo2DecoderLayer", {
    "q_norm": ("self_attn.q_norm", "output"),
    "k_norm": ("self_attn.k_norm", "output"),
    "attn_out": ("self_attn", "output"),
    "attn_post_norm": ("post_attention_layernorm", "output"),
    "resid_mid": ("mlp", "input"),
    "mlp_out": ("mlp", "output"),
    "mlp_post_norm": ("post_feedforward_layernorm", "output"),
})
#: StableLM with ``use_parallel_residual``: one norm feeds attention and MLP, both added to the input.
STABLELM_PARALLEL = _llama_like("stablelm", "StableLmDecoderLayer", {
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attn", "output"),
    "mlp_out": ("mlp", "output"),
}, when={"use_parallel_residual": True})
#: StableLM's default, sequential block: Llama's, with LayerNorms.
STABLELM = _llama_like("stablelm", "StableLmDecoderLayer")
#: Falcon's new decoder architecture with two norms (``ln_attn``, ``ln_mlp``): parallel.
FALCON_NEW_ARCHITECTURE = Architecture(
    name="falcon", layers=H_LAYERS, layer_class="FalconDecoderLayer", attention=("self_attention", 1),
    logits="lm_head", when={"new_decoder_architecture": True, "num_ln_in_parallel_attn": 2},
    stages={
        "attn_in": ("ln_attn", "output"),
        "mlp_in": ("ln_mlp", "output"),
        "attn_out": ("self_attention", "output"),
        "mlp_out": ("mlp", "output"),
    })
#: Falcon without parallel attention (``parallel_attn=False``): sequential, Llama's stages.
FALCON_SEQUENTIAL = Architecture(
    name="falcon", layers=H_LAYERS, layer_class="FalconDecoderLayer", attention=("self_attention", 1),
    logits="lm_head", when={"parallel_attn": False},
    stages={
        "attn_in": ("input_layernorm", "output"),
        "attn_out": ("self_attention", "output"),
        "resid_mid": ("post_attention_layernorm", "input"),
        "mlp_in": ("post_attention_layernorm", "output"),
        "mlp_out": ("mlp", "output"),
    })
#: Falcon's parallel attention with one norm (Falcon-7B; the new architecture with
#: ``num_ln_in_parallel_attn=1``): ``input_layernorm`` feeds attention and MLP.
FALCON_PARALLEL = Architecture(
    name="falcon", layers=H_LAYERS, layer_class="FalconDecoderLayer", attention=("self_attention", 1),
    logits="lm_head",
    stages={
        "attn_in": ("input_layernorm", "output"),
        "attn_out": ("self_attention", "output"),
        "mlp_out": ("mlp", "output"),
    })
#: GPT-2 (``transformer.h.N``): ``ln_1``, ``attn``, residual add, ``ln_2``, ``mlp``, residual add.
GPT2 = Architecture(
    name="gpt2", layers=H_LAYERS, layer_class="GPT2Block", attention=("attn", 1), logits="lm_head",
    stages={
        "attn_in": ("ln_1", "output"),
        "attn_out": ("attn", "output"),
        "resid_mid": ("ln_2", "input"),
        "mlp_in": ("ln_2", "output"),
        "mlp_out": ("mlp", "output"),
    })
#: BERT encoder layers (transformers' BertLayer): post-norm.
BERT = Architecture(
    name="bert",
    layers=r"^(?:.*\.)?layer\.(\d+)$",
    layer_class="BertLayer",
    stages={
        "attn_out": ("attention.output.dense", "output"),
        "resid_mid": ("attention", "output"),
        "mlp_out": ("output.dense", "output"),
    },
    attention=("attention.self", 1),
)

#: Every preset, in the order they are tried: a class's variants with a ``when`` before the one
#: without.
FAMILIES: Tuple[Architecture, ...] = (
    LLAMA, MISTRAL, MIXTRAL, QWEN2, QWEN2_MOE, QWEN3, QWEN3_MOE, GEMMA, GEMMA2, GEMMA3, PHI3, OLMO2, GRANITE,
    STARCODER2, STABLELM_PARALLEL, STABLELM, FALCON_NEW_ARCHITECTURE, FALCON_SEQUENTIAL, FALCON_PARALLEL, GPT2,
    BERT,
)


def known(families: Sequence[Architecture] = ()) -> Dict[str, Architecture]:
    """The presets by family name (a family with variants: its last, unconditional one)."""
    return {architecture.name: architecture for architecture in (families or FAMILIES)}


def choose(classes: Sequence[str], config: Any, families: Optional[Sequence[Architecture]] = None
           ) -> Optional[Architecture]:
    """The first preset whose block class is among ``classes`` (the model's module classes) and
    whose ``when`` holds on ``config``; None when no preset knows any of these classes."""
    present = set(classes)
    for architecture in FAMILIES if families is None else families:
        if architecture.layer_class in present and architecture.applies_to(config):
            return architecture
    return None


def stage_table(families: Sequence[Architecture] = FAMILIES) -> str:
    """A Markdown table of the stages each preset records (what docs/trace-format.md shows)."""
    vocabulary = ["attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out",
                  "mlp_post_norm"]
    lines = ["| family | block class | variant | " + " | ".join(f"`{s}`" for s in vocabulary) + " |",
             "|---|---|---|" + "---|" * len(vocabulary)]
    for architecture in families:
        variant = ", ".join(f"{k}={v}" for k, v in architecture.when.items()) or "default"
        cells = ["✓" if stage in architecture.stages else "" for stage in vocabulary]
        lines.append(f"| {architecture.name} | `{architecture.layer_class}` | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- inference of an unknown block class -----------------------------------------------------

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
