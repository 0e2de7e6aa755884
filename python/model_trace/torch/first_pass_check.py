"""The stage check on the first pass of a trace: each layer's stages checked against the
identities their names promise (:mod:`model_trace.stage_check`) when the layer ends.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List

from .. import stage_check
from ..stage_check import StageMapError
from ..writer import TraceWriter


class FirstPassCheck:
    """The stage check on the first pass (pass 0): each stage's tensor copied when it is
    recorded (float32, on its device: a module may change its output in place later, as
    Falcon's MLP output is), the layer checked when it ends (its copies then read back to host
    memory and dropped), a failure raised as :class:`StageMapError`. Later passes cost nothing."""

    def __init__(self, writer: TraceWriter, residual_multiplier: float):
        self.writer = writer
        self.residual_multiplier = residual_multiplier
        self.layers: Dict[int, Dict[str, Any]] = {}
        self.outcomes: List[stage_check.Outcome] = []

    def active(self) -> bool:
        return self.writer.pass_index == 0

    def keep(self, layer: int, stage: str, tensor: Any) -> None:
        import torch

        if isinstance(tensor, torch.Tensor) and self.active():
            self.layers.setdefault(layer, {})[stage] = tensor.detach().to(torch.float32, copy=True)

    def finish(self, layer: int, path: str) -> None:
        kept = self.layers.pop(layer, None)
        if kept is None or not self.active():
            return
        values = {stage: tensor.cpu().numpy() for stage, tensor in kept.items()}
        outcomes = stage_check.check_layer(values, layer, self.residual_multiplier)
        self.outcomes += outcomes
        failures = [o for o in outcomes if not o.passed]
        if failures:
            raise StageMapError(failures, f"model_trace.torch: pass 0, layer {layer} ({path})")

    def report(self) -> stage_check.Report:
        return stage_check.Report(list(self.outcomes))

    def passed(self, layers: Iterable[int]) -> bool:
        """Whether every one of ``layers`` was checked (pass 0 ran to its end) and nothing failed."""
        return bool(self.outcomes) and {outcome.layer for outcome in self.outcomes} >= set(layers) \
            and all(outcome.passed for outcome in self.outcomes)
