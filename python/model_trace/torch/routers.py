"""The routers of mixture-of-experts blocks: what transformers' router modules return, recorded
as a ``router`` event per call (:meth:`model_trace.writer.TraceWriter.router`).

transformers 5's routers (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``, ``MixtralTopKRouter``,
``DeepseekV3TopkRouter``; 5.23 read) return ``(router_logits, weights, expert indices)``:
``router_logits`` ``[tokens, experts]`` the gate's linear output (in the model's dtype;
DeepSeek-V3's in float32), ``weights`` ``[tokens, k]`` what multiplies each chosen expert's
output (renormalised where the model does, DeepSeek-V3's times ``routed_scaling_factor``),
``indices`` ``[tokens, k]`` the chosen experts, unsorted for DeepSeek-V3 (``topk(...,
sorted=False)``). DeepSeek-V3's router chooses in itself: the selection bias and the grouped
top-k (other groups' scores masked with ``-inf``) are in its forward, so its indices are the
final choice.

Early 5.x releases returned a softmax router's probabilities as its logits. A softmax router's
"logits" whose rows all lie in [0, 1] and sum to 1 (within 1e-3) are taken for probabilities and
recorded as their logarithm: ``log softmax(l) = l − logsumexp(l)`` is the logits shifted per
row, which changes neither the softmax, nor the choice, nor any logit gap (so ``logit_margin``
is the same); a warning says so once per trace and the header's ``metadata.extra.router_logits``
records it. A sigmoid router's scores cannot be told from logits this way and are taken as
they come.

Cost: the router's three outputs are copied to the host when it returns (a wait for the device
per router call on a GPU: they are small) and each token's margins computed in Python.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

import numpy as np

from ..families import Router
from . import host

#: How far a row of probabilities may sum from 1.
PROBABILITY_SUM_TOLERANCE = 1e-3

LOG_PROBABILITIES = ("log of the probabilities the routers returned as logits (rows in [0, 1] summing to 1): "
                     "a shift per row of the logits")


def looks_like_probabilities(values: np.ndarray) -> bool:
    """Whether every row of ``values`` ``[rows, experts]`` lies in [0, 1] and sums to 1."""
    if values.size == 0 or values.shape[-1] < 2 or not np.all(np.isfinite(values)):
        return False
    if values.min() < 0.0 or values.max() > 1.0:
        return False
    sums = values.astype(np.float64).sum(axis=-1)
    return bool(np.all(np.abs(sums - 1.0) <= PROBABILITY_SUM_TOLERANCE))


def router_outputs(output: Any, path: str) -> Tuple[Any, Any, Any]:
    """``(logits, weights, indices)`` of a router's output; a ``ValueError`` naming the module
    for anything else."""
    import torch

    if (isinstance(output, (tuple, list)) and len(output) == 3
            and all(isinstance(value, torch.Tensor) for value in output)):
        return output[0], output[1], output[2]
    kind = type(output).__name__ + (f" of {len(output)}" if isinstance(output, (tuple, list)) else "")
    raise ValueError(f"model_trace.torch: the router {path} returned a {kind}, not (router_logits, weights, indices) "
                     "as transformers 5's routers do: give an Architecture whose router=None, or one naming the "
                     "module that returns them")


def _host(tensor: Any) -> Tuple[np.ndarray, str]:
    """A router output's values on the host (a blocking copy), float32, and its dtype's name."""
    return host.to_numpy(tensor.detach().cpu())


class RouterRecorder:
    """The router hooks of one trace: notes once that logits were probabilities."""

    def __init__(self, run: Any):
        self.run = run
        self.converted = False

    def hook(self, router: Router, module: Any, index: int, path: str) -> Any:
        """The forward hook of ``module``, the router of layer ``index``."""
        def on_router(_module: Any, _args: Any, output: Any) -> None:
            self.record(router, module, index, path, output)

        return on_router

    def record(self, router: Router, module: Any, index: int, path: str, output: Any) -> None:
        logits, weights, indices = router_outputs(output, path)
        logit_values, dtype = _host(logits)
        logit_values = logit_values.reshape(-1, logit_values.shape[-1]) if logit_values.ndim else logit_values
        if router.scoring == "softmax" and looks_like_probabilities(logit_values):
            logit_values = self._logs(logit_values)
        weight_values, _ = _host(weights)
        experts = indices.detach().cpu().numpy()
        bias = getattr(module, router.bias) if router.bias is not None else None
        bias_values = _host(bias)[0] if bias is not None else None
        groups = self._groups(router, module, path)
        run = self.run
        run.writer.router(logit_values, experts, weight_values, index, router.module, path, router.scoring,
                          bias_values, groups, run.wants("router", router.module, path, index), dtype)

    def _logs(self, probabilities: np.ndarray) -> np.ndarray:
        if not self.converted:
            self.converted = True
            warnings.warn("model_trace.torch: the routers returned probabilities as their logits (as early "
                          "transformers 5 releases do); recorded as their logarithm, which shifts each row and "
                          "changes neither the choice nor its margins", UserWarning, stacklevel=4)
            self.run.writer.rewrite_header(extra={"router_logits": LOG_PROBABILITIES})
        with np.errstate(divide="ignore"):
            return np.log(probabilities)

    @staticmethod
    def _groups(router: Router, module: Any, path: str) -> Optional[Tuple[int, int]]:
        if router.groups is None:
            return None
        missing = [name for name in router.groups if getattr(module, name, None) is None]
        if missing:
            raise ValueError(f"model_trace.torch: the router {path} has no {', '.join(missing)} (the groups its "
                             "architecture names)")
        return int(getattr(module, router.groups[0])), int(getattr(module, router.groups[1]))
