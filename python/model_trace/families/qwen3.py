"""Qwen 3: transformers' ``Qwen3DecoderLayer``, llama.cpp's ``qwen3`` graph: Llama's pre-norm
block with per-head query/key norms before RoPE (``self_attn.q_norm``/``k_norm``, seen as
``[batch, seq, heads, head_dim]``; llama.cpp's ``Qcur_normed-N``/``Kcur_normed-N``).
"""

from .layouts import PRE_NORM_QK_STAGES, NodeTable, TinyModel, llama_like, pre_norm_nodes

ORDER = 60
QWEN3 = llama_like("qwen3", "Qwen3DecoderLayer", PRE_NORM_QK_STAGES)
ARCHITECTURES = (QWEN3,)
NODE_TABLE = NodeTable("qwen3", "embd", pre_norm_nodes(qk=True))
TINY_MODELS = {"qwen3": TinyModel("qwen3", {"head_dim": 16})}
