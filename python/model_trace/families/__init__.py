"""The model families model-trace knows, one file a family: each holds everything the project
knows of its family (its transformers architectures, its llama.cpp node table, what is
particular to it), declared, in the manner of TransformerLens' ``supported_architectures``
adapters. Nothing here imports torch.

**Adding a family is one new file** in this folder: copy ``qwen2.py`` (a pre-norm block with a
llama.cpp graph of its own; ``mistral.py`` for a family whose GGUF converts to another family's
llama.cpp architecture, ``falcon.py`` for variants of one block class) and change what differs.
The package finds it (every module here but :data:`SHARED_MODULES` is a family file), and the
torch tracer, the llama.cpp writer, the stage check and the tests read it from here: no code or
test is edited (``python/tests/test_llama_cpp_families.py`` runs its node table on a tiny model of
it, see ``TINY_MODELS``). Its documentation is by hand: add the family's rows to docs/trace-format.md's
stage table and, for a graph of its own, its table of llama.cpp nodes
(``python/tests/test_family_files.py`` fails until they name it), and its name to the lists of
families in README.md and python/README.md. A family file is named after its family and
declares, as module constants:

- its presets: :class:`Architecture` constants named in capitals (``LLAMA``,
  ``FALCON_SEQUENTIAL``), which this package and ``model_trace.torch`` export under those names;
- ``ARCHITECTURES``: those presets in the order they are tried: variants of one block class whose
  forward depends on the config (Falcon, StableLM) with a ``when`` before the one without;
- ``ORDER``: where the family stands among the others in :data:`FAMILIES`: the order presets are
  tried in (which matters only for a model holding the blocks of two families), the rows of
  :func:`stage_table`, and, the first family that declares ``NAME_MAP_LEAVES`` first, the order
  of the Rust presets. Orders are unique (a test says so) and go by tens: a new family takes the
  next ten after the last (``FAMILY_FILES[-1].ORDER + 10``: 190 after BERT's 180); it matters
  only when its block class could meet another family's in one model;
- ``NODE_TABLE``: the :class:`NodeTable` of its llama.cpp graph (``general.architecture``), for a
  family with a graph of its own; or ``GGUF_ARCHITECTURE``: the llama.cpp architecture its GGUFs
  convert to, where another family's table reads them (Mistral and Mixtral: ``llama``); neither
  where llama.cpp is not read (BERT);
- ``TINY_MODELS`` (optional), for a family whose GGUFs llama.cpp reads: case name ->
  :class:`TinyModel`, the small random models of it on which the tests run llama.cpp's graph
  (``python/tests/test_llama_cpp_families.py``): each must record the stages its preset for that
  config records (the node table's, or a variant's), and pass the stage check with every identity
  those stages promise checked. Without it: one model, the family's name as transformers' model
  type, no fields of its own. Declare it where the model type differs (``gemma3_text``), where
  the converter or the model needs more (``head_dim``, MoE sizes), and one model more
  for each variant of the block (Falcon's ``falcon_new``);
- ``NAME_MAP_LEAVES`` (Llama, BERT): leaf module -> stage, the modules transformers'
  ``model_addition_debugger_context`` records inside a block: with them the family has a
  ``model-trace diff --map <family>`` preset (:mod:`model_trace.families.name_maps`).

The tracer picks the first preset of :data:`FAMILIES` whose ``layer_class`` is the class of the
model's blocks and whose ``when`` holds on the model's config; a class none of them names is
inferred from one pass (:func:`infer`, in :mod:`model_trace.families.inference`).

Stage names follow the stage vocabulary of docs/trace-format.md. Which family records which
stage (:func:`stage_table` prints it):

- pre-norm blocks (Llama, Mistral, Mixtral, Qwen 2/3 and their MoE, Gemma, Phi-3, Granite,
  StarCoder 2, GPT-2, sequential StableLM and Falcon): ``attn_in attn_out resid_mid mlp_in
  mlp_out``, Qwen 3 adding ``q_norm k_norm``;
- sandwich-norm blocks (Gemma 2, Gemma 3): ``attn_in attn_out attn_post_norm resid_mid mlp_in
  mlp_out mlp_post_norm``, Gemma 3 adding ``q_norm k_norm``;
- OLMo 2 (post-norms only): ``q_norm k_norm attn_out attn_post_norm resid_mid mlp_out
  mlp_post_norm``;
- parallel blocks (Falcon's new architecture and parallel attention, parallel StableLM):
  ``attn_in [mlp_in] attn_out mlp_out``, no ``resid_mid``;
- BERT (post-norm): ``attn_out resid_mid mlp_out``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Tuple

from .inference import (ATTENTION, IGNORED, MLP, NORM, UNKNOWN, Call, InferenceError, architecture_source, infer,
                        kind_of)
from .layouts import (ATTN_PROJECTION, ATTN_RESIDUAL, H_LAYERS, HEADS_FIRST, LAYERS, PRE_NORM_QK_STAGES,
                      PRE_NORM_STAGES, SANDWICH_STAGES, Architecture, NodeTable, Router, StageSource, TinyModel)

#: The modules of this package that are not family files: the declared types and shared
#: layouts, the inference of unknown block classes, the module names and the Rust presets.
SHARED_MODULES = ("layouts", "inference", "name_maps")


def _family_files() -> Tuple[ModuleType, ...]:
    """Every family file of this folder, by ``ORDER`` (then by name)."""
    files = []
    for found in pkgutil.iter_modules(__path__):
        if found.name in SHARED_MODULES or found.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{found.name}")
        missing = [name for name in ("ORDER", "ARCHITECTURES") if not hasattr(module, name)]
        if missing:
            raise ImportError(f"{module.__file__} declares no {' or '.join(missing)}: every module of "
                              f"{__name__} but {', '.join(SHARED_MODULES)} is a family file")
        files.append(module)
    return tuple(sorted(files, key=lambda module: (module.ORDER, module.__name__)))


#: The family files, in :data:`FAMILIES`' order.
FAMILY_FILES: Tuple[ModuleType, ...] = _family_files()

#: Every preset, in the order they are tried: the families' by their ``ORDER``, a class's
#: variants with a ``when`` before the one without.
FAMILIES: Tuple[Architecture, ...] = tuple(preset for family in FAMILY_FILES for preset in family.ARCHITECTURES)

#: Every family file's presets by their constant names (``LLAMA``, ``FALCON_SEQUENTIAL``), which
#: this module exports (``model_trace.families.LLAMA``).
PRESETS: Dict[str, Architecture] = {name: value for family in FAMILY_FILES for name, value in vars(family).items()
                                    if name.isupper() and isinstance(value, Architecture)}
globals().update(PRESETS)

#: The llama.cpp node tables, by llama.cpp architecture (``general.architecture``): each family
#: file's ``NODE_TABLE``.
TABLES: Dict[str, NodeTable] = {family.NODE_TABLE.architecture: family.NODE_TABLE for family in FAMILY_FILES
                                if hasattr(family, "NODE_TABLE")}


def family_name(family: ModuleType) -> str:
    """A family file's family: its file's name (``qwen2_moe``)."""
    return family.__name__.rsplit(".", 1)[-1]


def gguf_architecture(family: ModuleType) -> Optional[str]:
    """The llama.cpp architecture a family's GGUFs convert to (its own table's, or the one its
    ``GGUF_ARCHITECTURE`` names), None where llama.cpp is not read."""
    table = getattr(family, "NODE_TABLE", None)
    return table.architecture if table is not None else getattr(family, "GGUF_ARCHITECTURE", None)


def tiny_models(family: ModuleType) -> Dict[str, TinyModel]:
    """The small random models of a family the tests run llama.cpp on: its ``TINY_MODELS``, or
    one of its name's model type with no fields of its own; none where llama.cpp is not read."""
    if gguf_architecture(family) is None:
        return {}
    return dict(getattr(family, "TINY_MODELS", None) or {family_name(family): TinyModel(family_name(family))})


def known(families: Sequence[Architecture] = ()) -> Dict[str, Architecture]:
    """The presets by family name (a family with variants: its last, unconditional one)."""
    return {architecture.name: architecture for architecture in (families or FAMILIES)}


def choose(classes: Sequence[str], config: Any, families: Optional[Sequence[Architecture]] = None
           ) -> Optional[Architecture]:
    """The first preset whose block class is among ``classes`` (the model's module classes) and
    whose ``when`` holds on ``config``; None when no preset knows any of these classes."""
    present = set(classes)
    for architecture in FAMILIES if families is None else families:
        if architecture.layer_class in present and architecture.applies_to(config):
            return architecture
    return None


def stage_table(families: Sequence[Architecture] = FAMILIES) -> str:
    """A Markdown table of the stages each preset records (what docs/trace-format.md shows)."""
    vocabulary = ["attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out",
                  "mlp_post_norm"]
    lines = ["| family | block class | variant | " + " | ".join(f"`{s}`" for s in vocabulary) + " |",
             "|---|---|---|" + "---|" * len(vocabulary)]
    for architecture in families:
        variant = ", ".join(f"{k}={v}" for k, v in architecture.when.items()) or "default"
        cells = ["✓" if stage in architecture.stages else "" for stage in vocabulary]
        lines.append(f"| {architecture.name} | `{architecture.layer_class}` | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["ATTENTION", "ATTN_PROJECTION", "ATTN_RESIDUAL", "FAMILIES", "FAMILY_FILES", "H_LAYERS", "HEADS_FIRST",
           "IGNORED", "LAYERS", "MLP", "NORM", "PRESETS", "PRE_NORM_QK_STAGES", "PRE_NORM_STAGES", "SANDWICH_STAGES",
           "SHARED_MODULES", "TABLES", "UNKNOWN", "Architecture", "Call", "InferenceError", "NodeTable", "Router",
           "StageSource", "TinyModel", "architecture_source", "choose", "family_name", "gguf_architecture", "infer", "kind_of",
           "known", "stage_table", "tiny_models", *PRESETS]
