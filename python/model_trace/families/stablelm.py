"""StableLM: transformers' ``StableLmDecoderLayer``, in two variants of the one class chosen by
the config, llama.cpp's ``stablelm`` graph.
"""

from .layouts import NodeTable, llama_like, pre_norm_nodes

ORDER = 150
#: With ``use_parallel_residual``: one norm feeds attention and MLP, both added to the input (no
#: ``resid_mid``).
STABLELM_PARALLEL = llama_like("stablelm", "StableLmDecoderLayer", {
    "attn_in": ("input_layernorm", "output"),
    "attn_out": ("self_attn", "output"),
    "mlp_out": ("mlp", "output"),
}, when={"use_parallel_residual": True})
#: The default, sequential block: Llama's, with LayerNorms.
STABLELM = llama_like("stablelm", "StableLmDecoderLayer")
ARCHITECTURES = (STABLELM_PARALLEL, STABLELM)
NODE_TABLE = NodeTable("stablelm", "embd", pre_norm_nodes())
