"""Converts the output of transformers' ``model_addition_debugger_context`` (its
``*_debug_tree_SUMMARY.json``) into a trace file, so that ``model-trace diff`` compares it with
a trace of a port:

    from transformers.model_debugging_utils import model_addition_debugger_context
    with model_addition_debugger_context(model, debug_path="debug", do_prune_layers=False):
        model(**inputs)
    model_trace.hf_debugger.convert("debug/BertModel_debug_tree_SUMMARY.json", "hf.ndjson")
    # model-trace diff hf.ndjson port.ndjson --map bert

What the debugger records decides what the trace holds:

* statistics only (mean, std, min, max, printed to 5 significant digits): no fingerprint, sketch
  or samples, so ``diff`` compares statistics; the header says how precise they are
  (``stats_precision``), and ``diff`` widens its bounds by that much;
* outputs of leaf modules only (no attention probabilities, no block outputs): each leaf inside
  a block becomes a stage named by its path in the block (``attention.output.dense``), which
  ``diff --map bert`` / ``--map llama`` rename to the stage vocabulary; a block's ``input`` is
  its recorded input and its ``output`` the next block's input;
* std is the sample std (n − 1) over all elements: converted to the population std the format
  uses; the L2 norm is derived from the mean and std.

Keep every layer with ``do_prune_layers=False``; with the default, only the first and last
blocks are in the file (and so in the trace).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .format import f32
from .writer import TraceWriter

#: Relative precision of statistics printed with 5 significant digits.
STATS_PRECISION = 5e-5

_LAYER = re.compile(r"^(?P<prefix>.*?\.(?:layers|layer|h|blocks))\.(?P<index>\d+)(?:\.(?P<rest>.+))?$")
_NUMBER = re.compile(r"^tensor\(\s*([-+]?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?))", re.IGNORECASE)
_SHAPE = re.compile(r"\d+")


def _value(text: Any) -> Optional[float]:
    if not isinstance(text, str):
        return None
    match = _NUMBER.match(text.strip())
    return float(match.group(1)) if match else None


def _tensor(node: Any) -> Optional[Dict[str, Any]]:
    """A tensor summary of the format from the debugger's ``{shape, dtype, mean, std, min, max}``."""
    if not isinstance(node, dict) or "shape" not in node or "mean" not in node:
        return None
    shape = [int(d) for d in _SHAPE.findall(node["shape"])]
    count = math.prod(shape) if shape else 1
    mean, std, low, high = (_value(node.get(k)) for k in ("mean", "std", "min", "max"))
    if None in (mean, std, low, high):
        return None
    population_std = std * math.sqrt((count - 1) / count) if count > 1 else 0.0
    norm = math.sqrt(count * (population_std**2 + mean**2)) if all(map(math.isfinite, (mean, population_std))) else math.inf
    dtype = node.get("dtype", "").replace("torch.", "")
    return {
        "shape": shape,
        "dtype": {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(dtype, dtype),
        "stats": {
            "count": count,
            "min": f32(low),
            "max": f32(high),
            "mean": f32(mean),
            "std": f32(population_std),
            "l2_norm": f32(norm),
            "nan_count": 0,
            "inf_count": 0,
        },
    }


def _first_input(node: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    inputs = node.get("inputs") or {}
    args = inputs.get("args") or []
    if args:
        return _tensor(args[0])
    kwargs = inputs.get("kwargs") or {}
    return _tensor(kwargs.get("hidden_states"))


def _walk(node: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    yield node
    for child in node.get("children", []):
        yield from _walk(child)


def convert(summary_path: str, out_path: str) -> int:
    """Writes the trace of a ``*_SUMMARY.json``; returns the number of stages written."""
    with open(summary_path, "r", encoding="utf-8") as file:
        tree = json.load(file)
    nodes = list(_walk(tree))
    layers: Dict[int, List[Tuple[str, Dict[str, Any]]]] = {}
    order: List[int] = []
    after_last: Optional[Dict[str, Any]] = None
    for node in nodes:
        match = _LAYER.match(node.get("module_path", ""))
        if match is None:
            if order and after_last is None and _first_input(node) is not None:
                after_last = _first_input(node)
            continue
        index, rest = int(match.group("index")), match.group("rest")
        if index not in layers:
            layers[index] = []
            order.append(index)
            after_last = None
        if rest is None:
            tensor = _first_input(node)
            if tensor is not None:
                layers[index].insert(0, ("input", tensor))
        elif "outputs" in node:
            tensor = _tensor(node["outputs"])
            if tensor is not None:
                layers[index].append((rest, tensor))
    writer = TraceWriter(
        out_path,
        config={"trace_activations": True, "digests": "off"},
        metadata={
            "model": tree.get("module_path", ""),
            "extra": {
                "source": "transformers model_addition_debugger_context",
                "names": "modules",
                "stats_precision": str(STATS_PRECISION),
            },
        },
        digest=False,
    )
    writer.begin_pass(position=0, tracepoint="forward", function=tree.get("module_path", ""))
    written = 0
    for position, index in enumerate(order):
        stages = layers[index]
        following = layers[order[position + 1]] if position + 1 < len(order) else None
        output = next((t for n, t in following if n == "input"), None) if following else after_last
        if output is not None:
            stages = stages + [("output", output)]
        writer.begin_layer(index, "layer", f"layer.{index}")
        for name, tensor in stages:
            writer.stage_summary(name, tensor)
            written += 1
        writer.end_layer()
    writer.close()
    return written
