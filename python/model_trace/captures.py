"""A trace's captured tensors (the full values a capture filter saved beside it), by pass, layer
and stage, found through the events' ``capture`` pointers as the Rust side finds them: a layer's
stages under their names (``input``, ``attn_out``, ..., ``output``), its attention
probabilities under ``attention``, the logits under ``logits`` (at the layer their event
names).

    captures = Captures("port.ndjson")
    port = captures.values(0, 7, "mlp_out")      # a float32 array of the stage's shape
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, Tuple

import numpy as np

from .format import read_trace

#: (pass, layer, stage).
Key = Tuple[int, int, str]


class Captures:
    """The captured tensors of the trace at ``path``, read when asked for."""

    def __init__(self, path: str):
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.captures: Dict[Key, Dict[str, str]] = {}
        _, events = read_trace(path)
        for event in events:
            for stage, capture in _captures_of(event):
                self.captures.setdefault((event["pass"], event["layer"], stage), capture)

    def __contains__(self, key: Key) -> bool:
        return key in self.captures

    def __iter__(self) -> Iterator[Key]:
        """The captured (pass, layer, stage)s, in the order the trace wrote them."""
        return iter(self.captures)

    def values(self, pass_index: int, layer: int, stage: str) -> np.ndarray:
        """The captured values of (pass, layer, stage); ValueError naming the trace where it
        captured none."""
        from safetensors import safe_open

        capture = self.captures.get((pass_index, layer, stage))
        if capture is None:
            raise ValueError(f"{self.path} has no capture of pass {pass_index}, layer {layer}, {stage}")
        with safe_open(os.path.join(self.directory, capture["file"]), framework="np") as file:
            return file.get_tensor(capture["tensor"])


def _captures_of(event: Dict) -> Iterator[Tuple[str, Dict[str, str]]]:
    """(stage, capture pointer) of each captured tensor an event holds."""
    kind = event.get("event")
    if kind == "layer":
        for stage in event["stages"]:
            if stage["tensor"].get("capture"):
                yield stage["name"], stage["tensor"]["capture"]
    elif kind == "attention" and event["probs"].get("capture"):
        yield "attention", event["probs"]["capture"]
    elif kind == "logits" and event.get("logits", {}).get("capture"):
        yield "logits", event["logits"]["capture"]
