"""Gemma 3: transformers' ``Gemma3DecoderLayer`` (``Gemma3ForCausalLM``, and the language model
of ``Gemma3ForConditionalGeneration``: the vision tower's ``SiglipEncoderLayer`` blocks are not
of this class), llama.cpp's ``gemma3`` graph: Gemma 2's sandwich norms with per-head query/key
norms, which transformers applies after moving the heads first (``[batch, heads, seq,
head_dim]``): recorded positions first (``HEADS_FIRST``), as Qwen 3's and llama.cpp's are.

llama.cpp: ``inp_scaled`` (the embeddings times sqrt(width)) is layer 0's input;
``Qcur_normed-N``/``Kcur_normed-N`` are ``q_norm``/``k_norm`` (``[1, seq, heads, head_dim]``,
before RoPE, as transformers' ``q_norm``/``k_norm`` return them); ``attn_post_norm-N`` is
``attn_post_norm``, ``sa_out-N`` ``resid_mid``, ``ffn_norm-N`` ``mlp_in``
(``pre_feedforward_layernorm``), ``ffn_out-N`` ``mlp_out``, ``ffn_post_norm-N``
``mlp_post_norm``.
"""

from .layouts import HEADS_FIRST, SANDWICH_STAGES, NodeTable, TinyModel, llama_like, sandwich_nodes, with_qk_norms

ORDER = 100
GEMMA3 = llama_like("gemma3", "Gemma3DecoderLayer", with_qk_norms(SANDWICH_STAGES, HEADS_FIRST))
ARCHITECTURES = (GEMMA3,)
NODE_TABLE = NodeTable("gemma3", "inp_scaled", sandwich_nodes(qk=True, post_norms=True))
TINY_MODELS = {"gemma3_text": TinyModel("gemma3_text", {
    "head_dim": 16, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]})}
