"""Qwen 3 MoE: transformers' ``Qwen3MoeDecoderLayer``, llama.cpp's ``qwen3moe`` graph: Qwen 3's
block (per-head query/key norms) whose MLP is a mixture of experts: ``mlp_out`` is the MoE
block's output, llama.cpp's ``ffn_moe_out-N``. The router (``mlp.gate``, softmax, top-k, the
weights renormalised where ``norm_topk_prob``) is recorded as a ``router`` event per call.
"""

from .layouts import PRE_NORM_QK_STAGES, NodeTable, Router, TinyModel, llama_like, pre_norm_nodes

ORDER = 70
QWEN3_MOE = llama_like("qwen3_moe", "Qwen3MoeDecoderLayer", PRE_NORM_QK_STAGES, router=Router())
ARCHITECTURES = (QWEN3_MOE,)
NODE_TABLE = NodeTable("qwen3moe", "embd", pre_norm_nodes(mlp_out=("ffn_moe_out",), qk=True))
TINY_MODELS = {"qwen3_moe": TinyModel("qwen3_moe", {
    "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
    "mlp_only_layers": []})}
