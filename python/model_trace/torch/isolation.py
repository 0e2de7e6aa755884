"""Isolation replay: each layer of the traced model fed the input a trace of the port captured
for it (``model_trace.torch.trace(..., isolate=PORT_TRACE)``), so that each layer's output is
what the reference computes from the port's input: the port's ``MODEL_TRACE_ISOLATE`` the other
way round. Each replacement is an ``intervention`` event.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from .. import captures
from ..writer import TraceWriter


class Captures(captures.Captures):
    """The captured tensors of a trace (the port's), by (pass, layer, stage), which the
    reference's layers are fed (:meth:`feed`); a trace with no captured layer tensor is a
    ValueError."""

    def __init__(self, path: str):
        super().__init__(path)
        if not any(stage not in ("attention", "logits") for _, _, stage in self.captures):
            raise ValueError(f"{path} holds no captured layer tensors to replay: write it with "
                             "MODEL_TRACE_CAPTURE=layer:* (or capture=\"layer:*\")")

    def feed(self, writer: TraceWriter, layer: int, hidden: Any, args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Tuple[Any, Tuple[Tuple[Any, ...], Dict[str, Any]]]:
        """The layer's input replaced by the capture (same element count, the layer's own
        shape, dtype and device), the event written, and the hook's new (args, kwargs)."""
        import torch

        pass_index = writer.ensure_pass()
        if (pass_index, layer, "input") not in self:
            raise ValueError(f"isolate: {self.path} has no capture of pass {pass_index}, layer {layer}, input")
        replayed = self.values(pass_index, layer, "input")
        if replayed.size != hidden.numel():
            raise ValueError(f"isolate: pass {pass_index}, layer {layer}: the capture holds {replayed.size} values, "
                             f"the input {hidden.numel()} (shape {tuple(hidden.shape)})")
        before = hidden.detach().to(torch.float32).cpu().numpy()
        new = torch.from_numpy(np.ascontiguousarray(replayed, dtype=np.float32)).reshape(hidden.shape)
        new = new.to(dtype=hidden.dtype, device=hidden.device)
        source = f"{self.path} p{pass_index}.l{layer}.input"
        writer.intervention("input", f"stage=input replace({self.path})", before,
                            new.detach().to(torch.float32).cpu().numpy(), source=source)
        if args:
            return new, ((new,) + tuple(args[1:]), kwargs)
        return new, (args, {**kwargs, "hidden_states": new})
