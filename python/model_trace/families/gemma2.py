"""Gemma 2: transformers' ``Gemma2DecoderLayer``, llama.cpp's ``gemma2`` graph: sandwich norms
(``post_attention_layernorm`` is the attention's post-norm, before the residual add;
``pre_feedforward_layernorm`` the MLP's input norm; ``post_feedforward_layernorm`` the MLP's
post-norm). The logits recorded are the soft-capped ones the model returns.

llama.cpp: ``inp_scaled`` (the embeddings times sqrt(width)) is layer 0's input,
``attn_post_norm-N`` ``attn_post_norm``, ``sa_out-N`` ``resid_mid``, and ``ffn_post_norm``,
named without its layer (``cb(..., -1)``), ``mlp_post_norm``.
"""

from .layouts import SANDWICH_STAGES, NodeTable, TinyModel, llama_like, sandwich_nodes

ORDER = 90
GEMMA2 = llama_like("gemma2", "Gemma2DecoderLayer", SANDWICH_STAGES)
ARCHITECTURES = (GEMMA2,)
NODE_TABLE = NodeTable("gemma2", "inp_scaled", sandwich_nodes(qk=False, post_norms=True),
                       unnumbered=frozenset({"ffn_post_norm"}))
TINY_MODELS = {"gemma2": TinyModel("gemma2", {"head_dim": 16, "sliding_window": 64})}
