"""The rows of an ``attention`` event (docs/trace-format.md) for every query of a
``[batch, heads, q_len, k_len]`` tensor at once, in one pass of array operations over the
whole tensor: with torch on the tensor's own device (then one copy of the results to the
host), with numpy in host memory.

Per row, as the Rust runtime records it: the ``top_k`` heaviest finite weights that are > 0
and >= the threshold (heaviest first, the lower position first on ties), the tail mass (the
row's total minus the kept weights), the entropy ``−Σ w ln w`` in nats and the weight on
position 0. Total and entropy are over the normal positive finite weights (the Rust runtime
leaves subnormal ones out too), summed in float64.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Sequence, Tuple

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
    """Analyses every row of ``probs``, read as ``[batch, heads, q_len, k_len]`` with missing
    leading dimensions taken as 1: a torch tensor on a device is analysed there with torch; a
    CPU tensor or anything numpy reads, with numpy (torch's cost a operation on the CPU is
    several times numpy's, and its multithreaded ones wait for descheduled threads on a busy
    machine)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(probs, torch.Tensor):
        if probs.device.type != "cpu":
            return _analyse(probs.detach().to(torch.float32), top_k, weight_threshold, _Torch(torch, probs.device))
        probs = probs.detach().to(torch.float32).numpy()
    return _analyse(np.asarray(probs, dtype=np.float32), top_k, weight_threshold, _NUMPY)


def attention_rows_of_many(arrays: Sequence[np.ndarray], top_k: int = 10, weight_threshold: float = 0.01) -> List[AttentionRows]:
    """:func:`attention_rows` of several float32 arrays in host memory with the same number of
    keys (their last dimension), analysed together: one pass of array operations over all
    their rows (at a forward pass's sizes, an operation costs mostly what a call costs)."""
    shapes = [_dimensions(a) for a in arrays]
    if len(arrays) == 1:
        return [_analyse(arrays[0], top_k, weight_threshold, _NUMPY)]
    k_len = shapes[0][3]
    if any(shape[3] != k_len for shape in shapes):
        raise ValueError("model_trace: attention_rows_of_many needs arrays with the same number of keys")
    whole = _analyse(np.concatenate([np.reshape(a, (-1, k_len)) for a in arrays]), top_k, weight_threshold, _NUMPY)
    made, start = [], 0
    for batch, heads, q_len, _ in shapes:
        stop = start + batch * heads * q_len
        made.append(AttentionRows(batch, heads, q_len, k_len, whole.positions[start:stop], whole.weights[start:stop],
                                  whole.measures[start:stop]))
        start = stop
    return made


def _dimensions(w: Any) -> Tuple[int, int, int, int]:
    """``(batch, heads, q_len, k_len)`` of probabilities of 1 to 4 dimensions."""
    if w.ndim > 4 or w.ndim == 0:
        raise ValueError(f"model_trace: attention probabilities of shape {list(w.shape)}: expected 1 to 4 dimensions")
    return (1,) * (4 - w.ndim) + tuple(w.shape)  # type: ignore[return-value]


def _analyse(w: Any, top_k: int, weight_threshold: float, xp: "_Numpy") -> AttentionRows:
    """:func:`attention_rows` of float32 probabilities, with the array operations of ``xp``."""
    batch, heads, q_len, k_len = _dimensions(w)
    w = xp.contiguous(w.reshape(-1, k_len))
    width = min(top_k, k_len)
    finite = xp.isfinite(w)

    normal = finite & (w >= _SMALLEST_NORMAL)
    total = xp.float64(xp.where(normal, w, 0.0)).sum(1)
    mass = xp.float64(xp.where(normal, w, 1.0))  # ln 1 = 0: the others add nothing
    entropy = -(mass * xp.log(mass)).sum(1)

    # The heaviest first, the lower position first on ties, in one top-k: a positive float32's
    # bits order as the float does, so (bits << 32 | k_len − 1 − position) orders the pairs.
    candidate = finite & (w >= max(float(np.float32(weight_threshold)), _SMALLEST_POSITIVE))
    keys = xp.where(candidate, (xp.int64(w.view(xp.int32)) << 32) | xp.reversed_positions(k_len), -1)
    best = xp.largest(keys, width)
    kept = best >= 0
    positions = xp.where(kept, (k_len - 1) - (best & 0xFFFFFFFF), -1)
    weights = xp.float64(xp.where(kept, xp.gather(w, xp.where(kept, positions, 0)), 0.0))
    # Added in order, heaviest first, as the Rust runtime adds them.
    kept_mass = xp.sums_in_order(weights)
    first = w[:, 0] if k_len else xp.float64(total * 0)
    sink = xp.float64(xp.where(finite[:, 0] & (first > 0), first, 0.0)) if k_len else first

    tail = total - kept_mass
    measures = [xp.where(tail > 0, tail, 0.0), xp.where(entropy > 0, entropy, 0.0), sink]
    # One copy to the host: positions and float32 weights are exact in float64.
    packed = xp.host(xp.concatenate([xp.float64(positions), weights] + [m.reshape(-1, 1) for m in measures], 1))
    return AttentionRows(
        batch=batch, heads=heads, q_len=q_len, k_len=k_len,
        positions=packed[:, :width].astype(np.int64),
        weights=packed[:, width:2 * width].astype(np.float32),
        measures=packed[:, 2 * width:].astype(np.float32),
    )


class _Numpy:
    """The array operations of the analysis, in numpy."""

    int32 = np.int32
    isfinite = staticmethod(np.isfinite)
    where = staticmethod(np.where)
    log = staticmethod(np.log)

    @staticmethod
    def contiguous(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    @staticmethod
    def float64(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float64)

    @staticmethod
    def int64(a: np.ndarray) -> np.ndarray:
        return a.astype(np.int64)

    @staticmethod
    def reversed_positions(n: int) -> np.ndarray:
        return np.arange(n - 1, -1, -1, dtype=np.int64)

    @staticmethod
    def largest(keys: np.ndarray, count: int) -> np.ndarray:
        """The ``count`` largest of each row, largest first."""
        if count == 0:
            return keys[:, :0]
        top = np.partition(keys, keys.shape[1] - count, axis=1)[:, keys.shape[1] - count:]
        return np.sort(top, axis=1)[:, ::-1]

    @staticmethod
    def gather(a: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, index, axis=1)

    @staticmethod
    def sums_in_order(a: np.ndarray) -> np.ndarray:
        return np.cumsum(a, axis=1)[:, -1] if a.shape[1] else np.zeros(a.shape[0])

    @staticmethod
    def concatenate(arrays: List[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(arrays, axis=axis)

    @staticmethod
    def host(a: np.ndarray) -> np.ndarray:
        return a


_NUMPY = _Numpy()


class _Torch:
    """The array operations of the analysis, in torch on the tensors' device."""

    def __init__(self, torch: Any, device: Any):
        self.torch, self.device = torch, device
        self.int32 = torch.int32
        self.isfinite = torch.isfinite
        self.where = torch.where
        self.log = torch.log

    def contiguous(self, a: Any) -> Any:
        return a.contiguous()

    def float64(self, a: Any) -> Any:
        return a.to(self.torch.float64)

    def int64(self, a: Any) -> Any:
        return a.to(self.torch.int64)

    def reversed_positions(self, n: int) -> Any:
        return self.torch.arange(n - 1, -1, -1, dtype=self.torch.int64, device=self.device)

    def largest(self, keys: Any, count: int) -> Any:
        return self.torch.topk(keys, count, dim=1).values

    def gather(self, a: Any, index: Any) -> Any:
        return self.torch.gather(a, 1, index)

    def sums_in_order(self, a: Any) -> Any:
        # A loop of additions: a scan on a device adds in its own order.
        total = self.torch.zeros(a.shape[0], dtype=a.dtype, device=a.device)
        for column in a.unbind(dim=1):
            total = total + column
        return total

    def concatenate(self, arrays: List[Any], axis: int) -> Any:
        return self.torch.cat(arrays, dim=axis)

    def host(self, a: Any) -> np.ndarray:
        return a.cpu().numpy()
