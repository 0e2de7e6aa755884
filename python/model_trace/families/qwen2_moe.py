"""Qwen 2 MoE: transformers' ``Qwen2MoeDecoderLayer``, llama.cpp's ``qwen2moe`` graph.

``mlp`` is the MoE block (routed experts plus the gated shared expert), or a dense MLP on
``mlp_only_layers``; either way ``mlp_out`` is its output. In llama.cpp ``ffn_out-N`` is the
same sum: the routed experts' ``ffn_moe_out`` plus the gated shared expert. The router
(``mlp.gate``, softmax; not the shared expert's gate) is recorded as a ``router`` event per call.
"""

from .layouts import NodeTable, Router, TinyModel, llama_like, pre_norm_nodes

ORDER = 50
QWEN2_MOE = llama_like("qwen2_moe", "Qwen2MoeDecoderLayer", router=Router())
ARCHITECTURES = (QWEN2_MOE,)
NODE_TABLE = NodeTable("qwen2moe", "embd", pre_norm_nodes())
TINY_MODELS = {"qwen2_moe": TinyModel("qwen2_moe", {
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1, "mlp_only_layers": []})}
