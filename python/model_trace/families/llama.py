"""Llama: transformers' ``LlamaDecoderLayer``, llama.cpp's ``llama`` graph.

The pre-norm block the others are told against: ``input_layernorm``, ``self_attn``, residual
add, ``post_attention_layernorm`` (the pre-MLP norm), ``mlp``, residual add.

llama.cpp names every stage of it (``attn_out-N`` is after the output projection; only the
``llama`` and ``granite`` graphs name it) and reads transformers' Mistral and Mixtral with this
table too: their converters write ``llama`` (``mistral.py``, ``mixtral.py``). ``mlp_out`` is
``ffn_moe_out-N`` in a MoE layer (Mixtral's).

``model-trace diff --map llama`` renames the module names this family records with
``names="modules"``, and the leaf modules of transformers' ``model_addition_debugger_context``
(``NAME_MAP_LEAVES``), to the stage vocabulary.
"""

from .layouts import NodeTable, llama_like, pre_norm_nodes

ORDER = 10
LLAMA = llama_like("llama", "LlamaDecoderLayer")
ARCHITECTURES = (LLAMA,)
NODE_TABLE = NodeTable("llama", "embd", pre_norm_nodes(attn_out=("attn_out",), mlp_out=("ffn_out", "ffn_moe_out")))
NAME_MAP_LEAVES = {"self_attn.o_proj": "attn_out", "mlp.down_proj": "mlp_out"}
