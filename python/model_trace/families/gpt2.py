"""GPT-2: transformers' ``GPT2Block`` (``transformer.h.N``), llama.cpp's ``gpt2`` graph:
``ln_1``, ``attn``, residual add, ``ln_2``, ``mlp``, residual add.

llama.cpp: ``inpL`` (the token embeddings plus the learned position embeddings) is layer 0's
input; ``attn_out`` is the add of ``blk.N.attn_output.bias`` after the projection.
"""

from .layouts import H_LAYERS, Architecture, NodeTable, TinyModel, pre_norm_nodes

ORDER = 170
GPT2 = Architecture(
    name="gpt2", layers=H_LAYERS, layer_class="GPT2Block", attention=("attn", 1), logits="lm_head",
    stages={
        "attn_in": ("ln_1", "output"),
        "attn_out": ("attn", "output"),
        "resid_mid": ("ln_2", "input"),
        "mlp_in": ("ln_2", "output"),
        "mlp_out": ("mlp", "output"),
    })
ARCHITECTURES = (GPT2,)
NODE_TABLE = NodeTable("gpt2", "inpL", pre_norm_nodes())
TINY_MODELS = {"gpt2": TinyModel("gpt2", {"n_ctx": 128})}
