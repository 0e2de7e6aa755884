"""Gemma: transformers' ``GemmaDecoderLayer``, llama.cpp's ``gemma`` graph: Llama's block
(norms scale by 1 + weight); layer 0's input is the embeddings times sqrt(hidden), llama.cpp's
``inp_scaled``. llama.cpp calls the stream between the sub-blocks ``sa_out-N``.
"""

from .layouts import NodeTable, TinyModel, llama_like, sandwich_nodes

ORDER = 80
GEMMA = llama_like("gemma", "GemmaDecoderLayer")
ARCHITECTURES = (GEMMA,)
NODE_TABLE = NodeTable("gemma", "inp_scaled", sandwich_nodes(qk=False, post_norms=False))
TINY_MODELS = {"gemma": TinyModel("gemma", {"head_dim": 16})}
