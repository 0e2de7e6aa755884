"""Qwen 2 MoE: transformers' ``Qwen2MoeDecoderLayer``, llama.cpp's ``qwen2moe`` graph.

``mlp`` is the MoE block (routed experts plus the gated shared expert), or a dense MLP on
``mlp_only_layers``; either way ``mlp_out`` is its output. In llama.cpp ``ffn_out-N`` is the
same sum: the routed experts' ``ffn_moe_out`` plus the gated shared expert.
"""

from .layouts import NodeTable, llama_like, pre_norm_nodes

ORDER = 50
QWEN2_MOE = llama_like("qwen2_moe", "Qwen2MoeDecoderLayer")
ARCHITECTURES = (QWEN2_MOE,)
NODE_TABLE = NodeTable("qwen2moe", "embd", pre_norm_nodes())
