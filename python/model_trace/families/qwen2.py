"""Qwen 2: transformers' ``Qwen2DecoderLayer``, llama.cpp's ``qwen2`` graph: Llama's pre-norm
block.

llama.cpp leaves the attention's output projection unnamed: ``attn_out`` is the node that
multiplies by the layer's ``blk.N.attn_output.weight`` (``ATTN_PROJECTION``).

A new family with a pre-norm block and a llama.cpp graph of its own starts as a copy of this
file (``model_trace.families``' docstring says what each name declares).
"""

from .layouts import NodeTable, llama_like, pre_norm_nodes

ORDER = 40
QWEN2 = llama_like("qwen2", "Qwen2DecoderLayer")
ARCHITECTURES = (QWEN2,)
NODE_TABLE = NodeTable("qwen2", "embd", pre_norm_nodes())
