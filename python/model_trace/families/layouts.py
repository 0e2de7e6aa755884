"""What a family file declares, and the layouts several families share.

Three declarative types: an :class:`Architecture` says where a transformers model's blocks and
stages are (what ``model_trace.torch`` hooks); a :class:`NodeTable` says which nodes of a
llama.cpp graph are which stage (what ``model_trace.llama_cpp`` reads); a :class:`TinyModel` is a
small random model of the family on which the tests run its node table. Below them the block
layouts more than one family has: Llama's pre-norm block, Gemma 2's sandwich norms, in both
forms. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

#: A stage's tensor: (submodule path relative to the block, ``"output"`` or ``"input"``), and
#: optionally a layout: ``"heads_first"`` for a module that sees ``[batch, heads, seq, head_dim]``
#: (Gemma 3's q/k norms), recorded as ``[batch, seq, heads, head_dim]`` like the others.
StageSource = Tuple[str, ...]

#: The layout of a stage whose module sees the heads before the positions.
HEADS_FIRST = "heads_first"


@dataclass(frozen=True)
class Router:
    """A block's mixture-of-experts router, as transformers 5 has it: a submodule whose forward
    returns ``(router_logits, weights, expert indices)`` (``Qwen3MoeTopKRouter``,
    ``MixtralTopKRouter``, ``DeepseekV3TopkRouter``), recorded as a ``router`` event per call.

    ``module``: its path relative to the block (a block without it, a dense layer of a model
    with both, records none). ``scoring``: ``"softmax"`` or ``"sigmoid"``, how its logits become
    the scores experts are chosen by. ``bias``: the router's attribute holding the selection
    bias (DeepSeek-V3's ``e_score_correction_bias``), if any. ``groups``: the router's attributes
    holding ``(n_group, topk_group)`` of a grouped top-k, if any."""

    module: str = "mlp.gate"
    scoring: str = "softmax"
    bias: Optional[str] = None
    groups: Optional[Tuple[str, str]] = None


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
    ``router``: the block's mixture-of-experts router (:class:`Router`), if it has one.
    """

    name: str
    layers: str
    stages: Dict[str, StageSource] = field(default_factory=dict)
    attention: Optional[Tuple[str, int]] = None
    logits: Optional[str] = None
    layer_class: Optional[str] = None
    when: Dict[str, Any] = field(default_factory=dict)
    config_metadata: Tuple[str, ...] = ()
    router: Optional[Router] = None

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


#: The pseudo-node of a table that is the attention's output projection: the node whose operand
#: is the layer's ``blk.N.attn_output.weight`` (a matmul), or, after it, ``blk.N.attn_output.bias``
#: (the bias add), for graphs that leave that node unnamed.
ATTN_PROJECTION = "@attn_output"
#: The pseudo-node that is the sum of the attention's output and the residual stream: the first
#: add whose operand is the attention projection (or the last layer's row selection of it), for
#: graphs that leave it unnamed (Phi-3).
ATTN_RESIDUAL = "@attn_residual"

#: A table's stages: ``(stage, candidate nodes)`` in the order a layer computes them.
NodeStages = Tuple[Tuple[str, Tuple[str, ...]], ...]


@dataclass(frozen=True)
class NodeTable:
    """How one llama.cpp architecture's graph names what a layer computes.

    ``architecture``: the GGUF's ``general.architecture`` this table reads. ``embeddings``: the
    global node that is layer 0's ``input`` (the embeddings as the model scales them).
    ``stages``: ``(stage, candidate nodes)`` in the order a layer computes them; the first
    candidate the graph computed is taken (``ffn_out`` of a dense layer, ``ffn_moe_out`` of a MoE
    one). Node names are without their ``-N``. ``unnumbered``: nodes a layer names without its
    number (``cb(..., -1)`` inside the layer loop: Gemma 2's and OLMo 2's ``ffn_post_norm``),
    taken as the layer of the numbered node before them. ``variants``: ``(node, stages)``: where
    the graph computed that node, these stages replace ``stages`` (Falcon's new architecture,
    whose second attention norm moves the first to the MLP). ``residual_scale``: the GGUF key of
    a multiplier of the residual branches (Granite). ``qk_per_head``: the query/key norms are per
    head (``[1, seq, heads, head_dim]``, Gemma 3, Qwen 3) rather than over the whole projection
    (``[1, seq, heads*head_dim]``, OLMo 2)."""

    architecture: str
    embeddings: str
    stages: NodeStages
    unnumbered: FrozenSet[str] = frozenset()
    variants: Tuple[Tuple[str, NodeStages], ...] = ()
    residual_scale: Optional[str] = None
    qk_per_head: bool = True

    def nodes(self) -> FrozenSet[str]:
        """Every node name (pseudo-nodes included) a layer of this table may read."""
        every = [self.stages] + [stages for _, stages in self.variants]
        names = {node for stages in every for _, candidates in stages for node in candidates}
        return frozenset(names | {marker for marker, _ in self.variants} | {"kq_soft_max"})

    def stages_for(self, computed: Iterable[str]) -> NodeStages:
        """The stages of a graph that computed the nodes ``computed`` (its variant's, if any)."""
        present = set(computed)
        for marker, stages in self.variants:
            if marker in present:
                return stages
        return self.stages


@dataclass(frozen=True)
class TinyModel:
    """A small random model of a family, which the tests (``python/tests/tiny_gguf.py``) convert
    to a GGUF with llama.cpp's own converter and run through llama.cpp, to check the family's
    node table on a real graph.

    ``model_type``: transformers' model type (``AutoConfig.for_model``; ``gemma3_text``).
    ``config``: its config's fields on top of the tests' small ones (2 layers, width 64, 4 heads
    of which 2 key/value heads, a vocabulary of 256): what the converter or the model needs
    besides (``head_dim``, MoE sizes), or what picks a variant of the block (Falcon's
    ``new_decoder_architecture``)."""

    model_type: str
    config: Mapping[str, Any] = field(default_factory=dict)


# -- transformers' blocks ---------------------------------------------------------------------

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


def with_qk_norms(stages: Mapping[str, StageSource], *layout: str) -> Dict[str, StageSource]:
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
PRE_NORM_QK_STAGES = with_qk_norms(PRE_NORM_STAGES)

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


def llama_like(name: str, layer_class: str, stages: Mapping[str, StageSource] = PRE_NORM_STAGES,
               **extra: Any) -> Architecture:
    """A decoder laid out as Llama's (``model.layers.N``, ``self_attn`` giving the attention
    probabilities second, ``lm_head``) with ``stages`` (Llama's pre-norm ones by default)."""
    return Architecture(name=name, layers=LAYERS, stages=dict(stages), attention=("self_attn", 1),
                        logits="lm_head", layer_class=layer_class, **extra)


# -- llama.cpp's graphs -------------------------------------------------------------------------

def pre_norm_nodes(attn_out: Tuple[str, ...] = (ATTN_PROJECTION,), mlp_out: Tuple[str, ...] = ("ffn_out",),
                   qk: bool = False) -> NodeStages:
    """A pre-norm block's stages, as most of llama.cpp's graphs name them."""
    return (("attn_in", ("attn_norm",)),
            *((("q_norm", ("Qcur_normed",)), ("k_norm", ("Kcur_normed",))) if qk else ()),
            ("attn_out", attn_out), ("resid_mid", ("ffn_inp",)), ("mlp_in", ("ffn_norm",)),
            ("mlp_out", mlp_out), ("output", ("l_out",)))


def sandwich_nodes(qk: bool, post_norms: bool) -> NodeStages:
    """Gemma's blocks: ``sa_out`` is the stream between the sub-blocks; Gemma 2 and 3 add the
    post-norms that join the stream."""
    return (("attn_in", ("attn_norm",)),
            *((("q_norm", ("Qcur_normed",)), ("k_norm", ("Kcur_normed",))) if qk else ()),
            ("attn_out", (ATTN_PROJECTION,)),
            *((("attn_post_norm", ("attn_post_norm",)),) if post_norms else ()),
            ("resid_mid", ("sa_out",)), ("mlp_in", ("ffn_norm",)), ("mlp_out", ("ffn_out",)),
            *((("mlp_post_norm", ("ffn_post_norm",)),) if post_norms else ()),
            ("output", ("l_out",)))
