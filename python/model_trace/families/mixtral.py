"""Mixtral: transformers' ``MixtralDecoderLayer``, Llama's block whose MLP is the sparse MoE
block (fused experts in transformers 5): ``mlp_out`` is that block's output.

Its GGUF is llama.cpp's ``llama``, read with the table of ``llama.py``, where a MoE layer's
``mlp_out`` is ``ffn_moe_out-N``. The router (``mlp.gate``, softmax, top-2 renormalised) is
recorded as a ``router`` event per call.
"""

from .layouts import Router, TinyModel, llama_like

ORDER = 30
MIXTRAL = llama_like("mixtral", "MixtralDecoderLayer", router=Router())
ARCHITECTURES = (MIXTRAL,)
GGUF_ARCHITECTURE = "llama"
TINY_MODELS = {"mixtral": TinyModel("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2})}
