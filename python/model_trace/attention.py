"""The rows of an ``attention`` event (docs/trace-format.md) for every query of a
``[batch, heads, q_len, k_len]`` tensor at once: torch operations over the whole tensor on its
own device, then one copy of the results to the host. The analysis needs torch; the rows it gives do
not.

Per row, as the Rust runtime records it: the ``top_k`` heaviest finite weights that are > 0
and >= the threshold (heaviest first, the lower position first on ties), the tail mass (the
row's total minus the kept weights), the entropy ``−Σ w ln w`` in nats and the weight on
position 0. Total and entropy are over the normal positive finite weights (the Rust runtime
leaves subnormal ones out too), summed in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator

import numpy as np

from .format import f32

#: The smallest normal float32: weights below it take no part in the total and the entropy.
_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
#: The smallest positive float32: the threshold below which nothing is kept.
_SMALLEST_POSITIVE = float(np.float32(1.4e-45))


@dataclass
class AttentionRows:
    """The analysed rows of one attention tensor, row ``r`` being query ``r % q_len`` of head
    ``r // q_len % heads`` of batch row ``r // (heads * q_len)``."""

    batch: int
    heads: int
    q_len: int
    k_len: int
    #: ``[rows, min(top_k, k_len)]``: kept key positions, heaviest first, then -1.
    positions: np.ndarray
    #: ``[rows, min(top_k, k_len)]`` float32: their weights (0 past the kept ones).
    weights: np.ndarray
    #: ``[rows, 3]`` float32: tail mass, entropy and sink weight.
    measures: np.ndarray

    @property
    def kept(self) -> np.ndarray:
        """How many weights each row keeps."""
        return (self.positions >= 0).sum(axis=1)

    def records(self, layer: int) -> Iterator[Dict[str, Any]]:
        """Each row as the trace writes it, floats as Python floats (:func:`model_trace.format.f32`)."""
        for row, (kept, positions, weights, (tail, entropy, sink)) in enumerate(
                zip(self.kept, self.positions, self.weights, self.measures)):
            batch, rest = divmod(row, self.heads * self.q_len)
            head, query = divmod(rest, self.q_len)
            yield {
                "layer_idx": int(layer),
                "batch": batch,
                "head_idx": head,
                "query_pos": self.k_len - self.q_len + query,
                "num_keys": self.k_len,
                "top_k_positions": positions[:kept].tolist(),
                "top_k_weights": [f32(w) for w in weights[:kept]],
                "tail_mass": f32(tail),
                "entropy": f32(entropy),
                "sink_weight": f32(sink),
            }


def attention_rows(probs: Any, top_k: int = 10, weight_threshold: float = 0.01) -> AttentionRows:
    """Analyses every row of ``probs`` (a torch tensor on any device, or anything
    ``torch.as_tensor`` reads), read as ``[batch, heads, q_len, k_len]`` with missing leading
    dimensions taken as 1."""
    import torch

    w = torch.as_tensor(probs).detach().to(torch.float32)
    if w.dim() > 4 or w.dim() == 0:
        raise ValueError(f"model_trace: attention probabilities of shape {list(w.shape)}: expected 1 to 4 dimensions")
    while w.dim() < 4:
        w = w.unsqueeze(0)
    batch, heads, q_len, k_len = w.shape
    w = w.reshape(-1, k_len).contiguous()
    rows = w.shape[0]
    width = min(top_k, k_len)
    finite = torch.isfinite(w)

    normal = finite & (w >= _SMALLEST_NORMAL)
    mass = torch.where(normal, w.to(torch.float64), 0.0)
    total = mass.sum(dim=1)
    entropy = -torch.where(normal, mass * _log(torch.where(normal, mass, 1.0)), 0.0).sum(dim=1)

    # The heaviest first, the lower position first on ties, in one top-k: a positive float32's
    # bits order as the float does, so (bits << 32 | k_len − 1 − position) orders the pairs.
    candidate = finite & (w >= max(float(np.float32(weight_threshold)), _SMALLEST_POSITIVE))
    reversed_position = (k_len - 1 - torch.arange(k_len, device=w.device, dtype=torch.int64))
    keys = torch.where(candidate, (w.view(torch.int32).to(torch.int64) << 32) | reversed_position, -1)
    best = torch.topk(keys, width, dim=1).values if width else keys[:, :0]
    kept = best >= 0
    positions = torch.where(kept, k_len - 1 - (best & 0xFFFFFFFF), -1)
    weights = torch.where(kept, torch.gather(w, 1, positions.clamp(min=0)), 0.0)
    # Summed in order, heaviest first, as the Rust runtime adds them.
    kept_mass = torch.zeros(rows, dtype=torch.float64, device=w.device)
    for column in weights.to(torch.float64).unbind(dim=1):
        kept_mass = kept_mass + column
    first = w[:, 0] if k_len else torch.zeros(rows, device=w.device)
    sink = torch.where(torch.isfinite(first) & (first > 0), first, 0.0).to(torch.float64)

    tail = total - kept_mass
    measures = torch.stack([torch.where(tail > 0, tail, 0.0), torch.where(entropy > 0, entropy, 0.0), sink], dim=1)
    # One copy to the host: positions and float32 weights are exact in float64.
    packed = torch.cat([positions.to(torch.float64), weights.to(torch.float64), measures], dim=1).cpu().numpy()
    return AttentionRows(
        batch=batch, heads=heads, q_len=q_len, k_len=k_len,
        positions=packed[:, :width].astype(np.int64),
        weights=packed[:, width:2 * width].astype(np.float32),
        measures=packed[:, 2 * width:].astype(np.float32),
    )


def _log(values: Any) -> Any:
    """The natural logarithm of a float64 tensor. On the CPU numpy's: torch's runs on several
    threads from 2048 values on, which at these sizes costs more than it saves and, on a busy
    machine, waits for a descheduled thread for milliseconds."""
    import torch

    if values.device.type == "cpu":
        return torch.from_numpy(np.log(values.numpy()))
    return torch.log(values)
