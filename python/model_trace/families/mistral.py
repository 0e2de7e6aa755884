"""Mistral: transformers' ``MistralDecoderLayer``, Llama's pre-norm
block.

Its GGUF is llama.cpp's ``llama`` (the converter writes that architecture), read with the table
of ``llama.py``.
"""

from .layouts import TinyModel, llama_like

ORDER = 20
MISTRAL = llama_like("mistral", "MistralDecoderLayer")
ARCHITECTURES = (MISTRAL,)
GGUF_ARCHITECTURE = "llama"
TINY_MODELS = {"mistral": TinyModel("mistral", {"sliding_window": None})}
