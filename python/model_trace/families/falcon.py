"""Falcon: transformers' ``FalconDecoderLayer`` (``transformer.h.N``), in three variants of the
one class chosen by the config, llama.cpp's ``falcon`` graph.

llama.cpp's graph is parallel (attention and MLP both read the stream, no ``resid_mid``); the new
architecture's second attention norm (``attn_norm_2`` = ``ln_attn``) gives the MLP its own norm,
``attn_norm`` (= ``ln_mlp``): the table's variant where the graph computed ``attn_norm_2``.
"""

from typing import Any, Dict

from .layouts import ATTN_PROJECTION, H_LAYERS, Architecture, NodeTable, StageSource, TinyModel

ORDER = 160


def falcon(stages: Dict[str, StageSource], **when: Any) -> Architecture:
    """A variant of Falcon's block: ``stages`` where ``when`` holds on the config."""
    return Architecture(name="falcon", layers=H_LAYERS, layer_class="FalconDecoderLayer",
                        attention=("self_attention", 1), logits="lm_head", when=when, stages=stages)


#: The new decoder architecture with two norms (``ln_attn``, ``ln_mlp``): parallel.
FALCON_NEW_ARCHITECTURE = falcon({
    "attn_in": ("ln_attn", "output"),
    "mlp_in": ("ln_mlp", "output"),
    "attn_out": ("self_attention", "output"),
    "mlp_out": ("mlp", "output"),
}, new_decoder_architecture=True, num_ln_in_parallel_attn=2)
#: Without parallel attention (``parallel_attn=False``): sequential, Llama's stages.
FALCON_SEQUENTIAL = falcon({
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attention", "output"),
    "resid_mid": ("post_attention_layernorm", "input"),
    "mlp_in": ("post_attention_layernorm", "output"),
    "mlp_out": ("mlp", "output"),
}, parallel_attn=False)
#: Parallel attention with one norm (Falcon-7B; the new architecture with
#: ``num_ln_in_parallel_attn=1``): ``input_layernorm`` feeds attention and MLP.
FALCON_PARALLEL = falcon({
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attention", "output"),
    "mlp_out": ("mlp", "output"),
})
ARCHITECTURES = (FALCON_NEW_ARCHITECTURE, FALCON_SEQUENTIAL, FALCON_PARALLEL)
NODE_TABLE = NodeTable("falcon", "embd", (("attn_in", ("attn_norm",)), ("attn_out", (ATTN_PROJECTION,)),
                                          ("mlp_out", ("ffn_out",)), ("output", ("l_out",))),
                       variants=(("attn_norm_2", (("attn_in", ("attn_norm_2",)), ("mlp_in", ("attn_norm",)),
                                                  ("attn_out", (ATTN_PROJECTION,)), ("mlp_out", ("ffn_out",)),
                                                  ("output", ("l_out",)))),))
TINY_MODELS = {
    "falcon": TinyModel("falcon", {"num_key_value_heads": 1, "num_kv_heads": 1, "new_decoder_architecture": False,
                                   "parallel_attn": True, "multi_query": True, "alibi": False, "bias": False}),
    # Falcon 40B's layout: ln_attn and ln_mlp, grouped KV heads, parallel (transformers' layer sets
    # num_ln_in_parallel_attn=2 on the config it is built from; the preset's `when` reads it).
    "falcon_new": TinyModel("falcon", {"num_kv_heads": 2, "new_decoder_architecture": True,
                                       "num_ln_in_parallel_attn": 2, "parallel_attn": True, "alibi": False,
                                       "bias": False}),
}
