"""DeepSeek-V3: transformers' ``DeepseekV3DecoderLayer``, llama.cpp's ``deepseek2`` graph (which
runs DeepSeek V2 and V3): Llama's pre-norm block with multi-head latent attention (MLA), whose
MLP is dense on the first ``first_k_dense_replace`` layers and a mixture of experts after them
(routed experts plus the shared ones): ``mlp_out`` is the whole MLP's output, llama.cpp's
``ffn_out-N`` (``ffn_moe_out`` plus ``ffn_shexp`` in a MoE layer).

llama.cpp leaves the attention's output projection unnamed: ``attn_out`` is the node that
multiplies by the layer's ``blk.N.attn_output.weight`` (``ATTN_PROJECTION``).

The router (``mlp.gate``, ``DeepseekV3TopkRouter``) is recorded as a ``router`` event per call:
sigmoid scores, the selection bias ``e_score_correction_bias``, grouped top-k (``n_group``,
``topk_group``; transformers masks the other groups' scores with ``-inf``, as llama.cpp does);
its weights are the unbiased scores of the chosen experts, renormalised and multiplied by
``routed_scaling_factor``.
"""

from .layouts import NodeTable, Router, TinyModel, llama_like, pre_norm_nodes

ORDER = 190
DEEPSEEK_V3 = llama_like("deepseek_v3", "DeepseekV3DecoderLayer", router=Router(
    scoring="sigmoid", bias="e_score_correction_bias", groups=("num_group", "topk_group")))
ARCHITECTURES = (DEEPSEEK_V3,)
NODE_TABLE = NodeTable("deepseek2", "embd", pre_norm_nodes())
TINY_MODELS = {"deepseek_v3": TinyModel("deepseek_v3", {
    "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    "scoring_func": "sigmoid"})}
