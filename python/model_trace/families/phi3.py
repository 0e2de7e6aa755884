"""Phi-3: transformers' ``Phi3DecoderLayer``, llama.cpp's ``phi3`` graph: Llama's pre-norm block
with a fused ``qkv_proj`` and ``gate_up_proj`` inside ``self_attn`` and ``mlp``; the residual
dropouts are the identity in eval mode.

llama.cpp leaves both the attention's output projection and its sum with the stream unnamed:
``attn_out`` is ``ATTN_PROJECTION``, ``resid_mid`` the add that takes it as an operand
(``ATTN_RESIDUAL``). ``mlp_out`` is ``ffn_moe_out-N`` in a MoE layer.
"""

from .layouts import ATTN_PROJECTION, ATTN_RESIDUAL, NodeTable, TinyModel, llama_like

ORDER = 110
PHI3 = llama_like("phi3", "Phi3DecoderLayer")
ARCHITECTURES = (PHI3,)
NODE_TABLE = NodeTable("phi3", "embd", (("attn_in", ("attn_norm",)), ("attn_out", (ATTN_PROJECTION,)),
                                        ("resid_mid", (ATTN_RESIDUAL,)), ("mlp_in", ("ffn_norm",)),
                                        ("mlp_out", ("ffn_out", "ffn_moe_out")), ("output", ("l_out",))))
TINY_MODELS = {"phi3": TinyModel("phi3", {"pad_token_id": 0})}
