"""OLMo 2: transformers' ``Olmo2DecoderLayer``, llama.cpp's ``olmo2`` graph: no pre-norms;
post-norms on both branches; query/key norms over the whole projection (``[batch, seq,
heads*head_dim]``); the residual between the branches is the MLP's input.

llama.cpp names ``ffn_post_norm`` without its layer (``cb(..., -1)``).
"""

from .layouts import ATTN_PROJECTION, NodeTable, llama_like

ORDER = 120
OLMO2 = llama_like("olmo2", "Olmo2DecoderLayer", {
    "q_norm": ("self_attn.q_norm", "output"),
    "k_norm": ("self_attn.k_norm", "output"),
    "attn_out": ("self_attn", "output"),
    "attn_post_norm": ("post_attention_layernorm", "output"),
    "resid_mid": ("mlp", "input"),
    "mlp_out": ("mlp", "output"),
    "mlp_post_norm": ("post_feedforward_layernorm", "output"),
})
ARCHITECTURES = (OLMO2,)
NODE_TABLE = NodeTable("olmo2", "embd", (("q_norm", ("Qcur_normed",)), ("k_norm", ("Kcur_normed",)),
                                         ("attn_out", (ATTN_PROJECTION,)), ("attn_post_norm", ("attn_post_norm",)),
                                         ("resid_mid", ("ffn_inp",)), ("mlp_out", ("ffn_out",)),
                                         ("mlp_post_norm", ("ffn_post_norm",)), ("output", ("l_out",))),
                       unnumbered=frozenset({"ffn_post_norm"}), qk_per_head=False)
