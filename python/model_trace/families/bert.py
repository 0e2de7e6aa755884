"""BERT: transformers' ``BertLayer`` (``encoder.layer.N``): post-norm, so it records no norm
stage; ``resid_mid`` is the attention block's output (after its LayerNorm), which the MLP reads
and is added to. No llama.cpp table (llama.cpp's ``bert`` graph is not read).

``model-trace diff --map bert`` renames the module names this family records with
``names="modules"``, and the leaf modules of transformers' ``model_addition_debugger_context``
(``NAME_MAP_LEAVES``: the two LayerNorms, whose outputs are ``resid_mid`` and the layer's
``output``), to the stage vocabulary.
"""

from .layouts import Architecture

ORDER = 180
BERT = Architecture(
    name="bert",
    layers=r"^(?:.*\.)?layer\.(\d+)$",
    layer_class="BertLayer",
    stages={
        "attn_out": ("attention.output.dense", "output"),
        "resid_mid": ("attention", "output"),
        "mlp_out": ("output.dense", "output"),
    },
    attention=("attention.self", 1),
)
ARCHITECTURES = (BERT,)
NAME_MAP_LEAVES = {"attention.output.LayerNorm": "resid_mid", "output.LayerNorm": "output"}
