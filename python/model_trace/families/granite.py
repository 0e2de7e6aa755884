"""Granite: transformers' ``GraniteDecoderLayer``, llama.cpp's ``granite`` graph: Llama's block
with both residual branches scaled by ``residual_multiplier`` (recorded in the header for the
stage check), the embeddings by ``embedding_multiplier``, the logits divided by
``logits_scaling`` (the logits recorded are the ones the model returns).

llama.cpp: ``embd`` carries the embedding multiplier; ``attn_out`` and ``ffn_out`` are before the
residual scale, the GGUF's ``granite.residual_scale``, which the header records as
``residual_multiplier``.
"""

from .layouts import NodeTable, TinyModel, llama_like, pre_norm_nodes

ORDER = 130
GRANITE = llama_like("granite", "GraniteDecoderLayer", config_metadata=("residual_multiplier",))
ARCHITECTURES = (GRANITE,)
NODE_TABLE = NodeTable("granite", "embd", pre_norm_nodes(attn_out=("attn_out",), mlp_out=("ffn_out", "ffn_moe_out")),
                       residual_scale="granite.residual_scale")
TINY_MODELS = {"granite": TinyModel("granite", {
    "residual_multiplier": 0.5, "embedding_multiplier": 3.0, "logits_scaling": 2.0, "attention_multiplier": 0.25})}
