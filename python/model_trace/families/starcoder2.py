"""StarCoder 2: transformers' ``Starcoder2DecoderLayer``, llama.cpp's ``starcoder2`` graph:
Llama's pre-norm block with LayerNorms with bias and a ``c_fc``/``c_proj`` MLP. llama.cpp's
``attn_out`` is the add of ``blk.N.attn_output.bias`` after the projection.
"""

from .layouts import NodeTable, TinyModel, llama_like, pre_norm_nodes

ORDER = 140
STARCODER2 = llama_like("starcoder2", "Starcoder2DecoderLayer")
ARCHITECTURES = (STARCODER2,)
NODE_TABLE = NodeTable("starcoder2", "embd", pre_norm_nodes())
TINY_MODELS = {"starcoder2": TinyModel("starcoder2", {"use_bias": True})}
