"""The stages of a block class no family file knows, inferred on the first pass: the torch
side of :mod:`model_trace.families.inference`, which places them from the values recorded here.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Dict, List, Optional, Protocol, Tuple

import numpy as np

from .. import families
from ..families import HEADS_FIRST, Architecture
from ..writer import TraceWriter
from .blocks import Block, first_tensor, output_embeddings, tracepoints
from .first_pass_check import FirstPassCheck
from .host import host_values, kept


class Run(Protocol):
    """What inference needs of the run that hooks the model (:class:`model_trace.torch.tracing.Run`):
    where to keep its hooks, and how it records a stage and attention probabilities."""

    handles: List[Any]
    check: Optional[FirstPassCheck]
    record_attention: bool
    writer: TraceWriter
    model: Any
    layers: List[Block]

    def record_attention_output(self, index: int, attention_sub: str, attention_path: str, position: int,
                                output: Any) -> None: ...

    def record_stage(self, index: int, stage: str, source: Tuple[str, ...], path: str, tensor: Any) -> None: ...


class Inference:
    """The stages of a block class no preset knows, inferred on the first pass: the first
    block's children (and its attention's norms) recorded as they are called, placed at the
    block's end (:func:`model_trace.families.infer`), written for that block, then hooked as a
    preset's would be on every block; the header rewritten with the inferred architecture, and
    a warning printing it."""

    def __init__(self, placeholder: Architecture, logits: Optional[str]):
        self.placeholder = placeholder
        self.logits = logits
        self.calls: List[Dict[str, Any]] = []
        self.ticks = 0
        self.block_input: Optional[np.ndarray] = None
        self.inferred: Optional[Architecture] = None
        self.recording: List[Any] = []

    @classmethod
    def plan(cls, model: Any, modules: Dict[str, Any]) -> "Inference":
        """The blocks: the longest list of modules of one class that hold an attention module;
        an error naming the block classes seen when there is none."""
        import torch

        best: Optional[Tuple[str, Any]] = None
        for name, module in modules.items():
            if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
                continue
            classes = {type(child) for child in module}
            if len(classes) != 1:
                continue
            first = module[0]
            if not any(families.kind_of(child_name, type(child).__name__) == families.ATTENTION
                       for child_name, child in first.named_children()):
                continue
            if best is None or len(module) > len(best[1]):
                best = (name, module)
        if best is None:
            classes = sorted({type(m).__name__ for m in modules.values() if "Layer" in type(m).__name__
                              or "Block" in type(m).__name__})
            raise ValueError("model_trace.torch: unknown architecture (blocks of class "
                             f"{classes}), and no list of blocks with an attention submodule to infer the stages from; "
                             "pass architecture=Architecture(...)")
        path, blocks = best
        layer_class = type(blocks[0]).__name__
        pattern = "^" + re.escape(path) + r"\.(\d+)$"
        logits = output_embeddings(model, modules)
        placeholder = Architecture(name=f"inferred:{layer_class}", layers=pattern, layer_class=layer_class,
                                   logits=logits)
        return cls(placeholder, logits)

    def pending(self) -> bool:
        return self.inferred is None

    def record_children(self, run: Run, block: Any) -> None:
        """Hooks on the block's children and its attention's norms, recording each call: its
        input and output (float32 copies on their device), when it started and returned."""
        attention_children = [(f"{name}.{sub}", module) for name, child in block.named_children()
                              if families.kind_of(name, type(child).__name__) == families.ATTENTION
                              for sub, module in child.named_children()
                              if families.kind_of(sub, type(module).__name__) == families.NORM]
        for name, child in list(block.named_children()) + attention_children:
            def pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str = name) -> None:
                if self.pending():
                    hidden = args[0] if args else kwargs.get("hidden_states")
                    self.calls.append({"path": name, "input": kept(hidden), "started": self.clock()})

            def post(module: Any, _args: Any, output: Any, name: str = name) -> None:
                if not self.pending():
                    return
                call = next(c for c in reversed(self.calls) if c["path"] == name and "finished" not in c)
                call.update(output=kept(first_tensor(output)), raw=output, finished=self.clock(),
                            class_name=type(module).__name__)

            self.recording.append(child.register_forward_pre_hook(pre, with_kwargs=True))
            self.recording.append(child.register_forward_hook(post))
        run.handles += self.recording

    def clock(self) -> int:
        self.ticks += 1
        return self.ticks

    def infer(self, run: Run, index: int, path: str, output: Any) -> Architecture:
        """The architecture from the first block's recorded calls; its stages written for this
        block (in the order the hooks would have written them), the recording hooks removed, the
        header rewritten, a warning."""
        for handle in self.recording:
            handle.remove()
        block_input = self.block_input
        seq = block_input.shape[1] if block_input is not None and block_input.ndim >= 2 else None
        calls = []
        for call in self.calls:
            if "finished" not in call:
                continue  # a call that never returned
            hidden_out = call["output"]
            layout = ""
            if hidden_out is not None and hidden_out.ndim == 4 and seq is not None \
                    and hidden_out.shape[2] == seq and hidden_out.shape[1] != seq:
                layout = HEADS_FIRST
            calls.append(families.Call(call["path"], call["class_name"], host_values(call["input"]), host_values(hidden_out),
                                       call["started"], call["finished"], layout))
        by_path = {call["path"]: call for call in self.calls if "finished" in call}
        multiplier = run.check.residual_multiplier if run.check is not None else 1.0
        architecture = families.infer(self.placeholder.layer_class or "", self.placeholder.layers, calls,
                                      block_input if block_input is not None else np.zeros(0),
                                      host_values(kept(output)), logits=self.logits, residual_multiplier=multiplier)
        self.inferred = architecture
        self.calls = []
        # This block's attention probabilities and stages, as the hooks would have recorded them.
        if run.record_attention and architecture.attention is not None:
            sub, position = architecture.attention
            if sub in by_path:
                run.record_attention_output(index, sub, f"{path}.{sub}", position, by_path[sub]["raw"])
        for stage, source in architecture.stages.items():
            call = by_path[source[0]]
            run.record_stage(index, stage, source, f"{path}.{source[0]}",
                             call["input"] if source[1] == "input" else call["output"])
        run.writer.rewrite_header(tracepoints(run.model, run.layers, architecture), {"architecture": architecture.name})
        warnings.warn(f"model_trace.torch: blocks of class {architecture.layer_class} are of no known family; the "
                      f"stages inferred from the first pass (they satisfy the stage check on layer {index}) are, to "
                      f"pass as architecture= (from model_trace.families import Architecture):\n"
                      f"{families.architecture_source(architecture)}", stacklevel=2)
        return architecture
