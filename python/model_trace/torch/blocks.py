"""The parts of a model the tracer hooks: its family's preset (:func:`detect`), its blocks, a
block's submodules, the head that gives the logits, and the tracepoints they are in the header.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from .. import families
from ..families import Architecture

#: A block of the model: (layer index, path in ``named_modules()``, module).
Block = Tuple[int, str, Any]


def detect(model: Any, modules: Optional[Dict[str, Any]] = None) -> Architecture:
    """The architecture of a transformers model, from the class of its blocks (``modules``:
    ``dict(model.named_modules())`` when the caller has it) and, for a class whose block
    depends on it (Falcon, StableLM), its config. Raises ``ValueError`` for a class no preset
    knows (:func:`model_trace.torch.trace` infers those)."""
    classes = [type(module).__name__ for module in (modules.values() if modules is not None else model.modules())]
    architecture = families.choose(classes, getattr(model, "config", None))
    if architecture is None:
        raise ValueError(
            "model_trace.torch: unknown architecture (blocks of class "
            f"{sorted({c for c in classes if 'Layer' in c or 'Block' in c})}); pass architecture=Architecture(...)"
        )
    return architecture


def blocks_of(architecture: Architecture, modules: Dict[str, Any]) -> List[Block]:
    """The blocks the architecture's pattern and class select; an error that says which of the
    two selected nothing."""
    pattern = re.compile(architecture.layers)
    matched = [(int(m.group(1)), name, module) for name, module in modules.items() if (m := pattern.match(name))]
    layers = [layer for layer in matched
              if architecture.layer_class is None or type(layer[2]).__name__ == architecture.layer_class]
    if layers:
        return layers
    if matched:
        classes = sorted({type(module).__name__ for _, _, module in matched})
        raise ValueError(f"model_trace.torch: {len(matched)} modules match the layer pattern {architecture.layers} "
                         f"of the {architecture.name!r} architecture but are of class {', '.join(classes)}, not "
                         f"{architecture.layer_class}: the architecture is not this model's (leave architecture= out to "
                         "detect it, or give an Architecture with layer_class=" f"{classes[0]!r})")
    raise ValueError(f"model_trace.torch: no module matches the layer pattern {architecture.layers} of the "
                     f"{architecture.name!r} architecture")


def output_embeddings(model: Any, modules: Dict[str, Any]) -> Optional[str]:
    """The path of the model's output embeddings (transformers' ``get_output_embeddings``), or
    None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        return None
    return next((name for name, module in modules.items() if module is head), None)


def output_head(model: Any, modules: Dict[str, Any], architecture: Architecture) -> Optional[str]:
    """The path of the module whose output is the logits: the architecture's, else the model's
    output embeddings, else None."""
    if architecture.logits is not None:
        return architecture.logits
    return output_embeddings(model, modules)


def config_value(config: Any, key: str) -> Any:
    """A config attribute, looked up in the text config too (a multimodal model's)."""
    for candidate in (config, getattr(config, "get_text_config", lambda: None)()):
        if candidate is not None and hasattr(candidate, key):
            return getattr(candidate, key)
    return None


def tracepoints(model: Any, layers: List[Block], architecture: Architecture) -> List[Dict[str, Any]]:
    """The header's tracepoints: the model's forward, its blocks, each stage, the router."""
    found = [{"kind": "model", "name": "forward", "function": type(model).__name__, "file": "", "line": 0}]
    found += [{"kind": "layer", "name": type(layers[0][2]).__name__, "function": name, "file": "", "line": 0}
              for _, name, _ in layers[:1]]
    found += [{"kind": "tensor", "name": stage, "function": source[0], "file": "", "line": 0}
              for stage, source in architecture.stages.items()]
    if architecture.router is not None:
        found.append({"kind": "router", "name": architecture.router.module, "function": architecture.router.module,
                      "file": "", "line": 0})
    return found


def first_tensor(value: Any) -> Any:
    """``value``, or its first element if it is a tuple or list (module outputs such as
    ``(hidden_states, attn_weights)``)."""
    if isinstance(value, (tuple, list)):
        return value[0] if value else None
    return value


class Submodules:
    """A block's submodules by their path in it, looked up among the model's (a module shared
    with an earlier place is listed there only once: then among the block's own)."""

    def __init__(self, block: Any, path: str, all_modules: Dict[str, Any]):
        self.block, self.path, self.all_modules = block, path, all_modules
        self.own: Optional[Dict[str, Any]] = None

    def get(self, relative: str) -> Any:
        found = self.all_modules.get(f"{self.path}.{relative}" if relative else self.path)
        if found is None:
            if self.own is None:
                self.own = dict(self.block.named_modules())
            found = self.own.get(relative)
        return found
