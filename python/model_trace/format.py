"""The model-trace file format (docs/trace-format.md): tensor summaries computed exactly as the
Rust runtime computes them, the lossless encoding of floats, and a reader.

Everything here needs only numpy (and the ``blake3`` package for fingerprints).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    from .floats import FloatTexts

FORMAT_NAME = "model-trace"
SCHEMA_VERSION = 1
SKETCH_DIM = 8
SKETCH_SEED = 0x6D646C7472616365
SAMPLE_LEN = 4

_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def as_f32(values: Any) -> np.ndarray:
    """The values as a flat, row-major float32 array (how every tensor is read)."""
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32)).reshape(-1)


def element_hashes(n: int) -> np.ndarray:
    """``h(i)`` of the sketch's definition for ``i`` in ``0..n``: SplitMix64's finaliser of
    ``i * 0x9E3779B97F4A7C15 + SKETCH_SEED`` in wrapping uint64 arithmetic."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = i * _GOLDEN_GAMMA + np.uint64(SKETCH_SEED)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    return z


#: Bytes of sketch signs kept for reuse (tensors of one model come in a few lengths).
SIGNS_CACHE_BYTES = 64 << 20
_signs_cache: "OrderedDict[int, np.ndarray]" = OrderedDict()


def sketch_signs(n: int) -> np.ndarray:
    """``s_k(i)`` of the sketch's definition for ``k`` in ``0..8`` and ``i`` in ``0..n``, as a
    float64 array ``[8, n]`` of ±1 (read-only: the last lengths asked for are kept, up to
    ``SIGNS_CACHE_BYTES``)."""
    signs = _signs_cache.get(n)
    if signs is not None:
        _signs_cache.move_to_end(n)
        return signs
    bits = (element_hashes(n)[None, :] >> np.arange(SKETCH_DIM, dtype=np.uint64)[:, None]) & np.uint64(1)
    signs = 1.0 - 2.0 * bits.astype(np.float64)
    signs.flags.writeable = False
    if signs.nbytes <= SIGNS_CACHE_BYTES:
        _signs_cache[n] = signs
        while sum(cached.nbytes for cached in _signs_cache.values()) > SIGNS_CACHE_BYTES:
            _signs_cache.popitem(last=False)
    return signs


def sketch(values: Any) -> np.ndarray:
    """The 8-component sketch, bit for bit as the Rust runtime computes it: per component the
    sum, in float64 and in index order, of ``±x_i`` over the finite values, rounded to float32."""
    x = as_f32(values)
    return _sketch(np.where(np.isfinite(x), x, np.float32(0)).astype(np.float64))


#: The unit roundoff of float64.
_UNIT_ROUNDOFF = 2.0**-53


def _sketch(values: np.ndarray) -> np.ndarray:
    """The sketch of float64 values (float32 ones, the non-finite replaced by 0), without
    adding in index order where the order cannot change the float32 result.

    Any order of adding ``n`` terms is within ``γ(n−1)·Σ|t|`` of the exact sum
    (``γ(m) = m·u/(1 − m·u)``, ``u`` the unit roundoff; ``±x`` times ±1 is exact, so a fused
    multiply-add rounds as an addition does): a matrix product (BLAS, in its own order) and the
    sum in order are within twice that of each other. Where no float32 rounding boundary lies
    that close to the product's sum, both round to the same float32; the other components are
    added in order (``np.cumsum``; ``np.sum`` is pairwise)."""
    if values.size == 0:
        return np.zeros(SKETCH_DIM, dtype=np.float32)
    signs = sketch_signs(values.size)
    sums = signs @ values
    rounded = sums.astype(np.float32)
    below = (rounded.astype(np.float64) + np.nextafter(rounded, np.float32(-np.inf)).astype(np.float64)) / 2
    above = (rounded.astype(np.float64) + np.nextafter(rounded, np.float32(np.inf)).astype(np.float64)) / 2
    # Four times the bound between the two sums: room for the rounding of Σ|x| and of the
    # differences below.
    bound = 8 * values.size * _UNIT_ROUNDOFF * np.abs(values).sum()
    unsure = ~((sums - below > bound) & (above - sums > bound))
    for component in np.flatnonzero(unsure):
        rounded[component] = np.float32(np.cumsum(signs[component] * values)[-1])
    # In order from +0.0, a sum of zeros is +0.0; in another order it may be -0.0.
    rounded[rounded == 0] = 0.0
    return rounded


def fingerprint(values: Any) -> str:
    """BLAKE3 of the values as float32 little-endian bytes, as 64 hex digits."""
    import blake3

    return blake3.blake3(as_f32(values).astype("<f4").tobytes()).hexdigest()


#: Names of the floats of the statistics, in the order of :attr:`Summary.floats`.
STAT_FLOATS = ("min", "max", "mean", "std", "l2_norm")


def stat_numbers(values: Any) -> Tuple[int, int, np.ndarray]:
    """``nan_count``, ``inf_count`` and the float32 array of ``min``, ``max``, ``mean``,
    ``std`` and ``l2_norm`` (see :func:`stats`)."""
    return _statistics(as_f32(values))[:3]


def _statistics(x: np.ndarray) -> Tuple[int, int, np.ndarray, Optional[np.ndarray]]:
    """:func:`stat_numbers` of a flat float32 array, and the array in float64 when every value
    is finite (``None`` otherwise)."""
    low = high = np.float32(0)
    if x.size:
        low, high = x.min(), x.max()  # NaN if any value is
    if np.isfinite(low) and np.isfinite(high):
        nan_count = inf_count = 0
        finite = everything = x.astype(np.float64)
    else:
        finite_mask = np.isfinite(x)
        nan_count = int(np.isnan(x).sum())
        inf_count = int(x.size - nan_count - finite_mask.sum())
        finite, everything = x[finite_mask].astype(np.float64), None
    if finite.size == 0:
        return nan_count, inf_count, np.zeros(len(STAT_FLOATS), dtype=np.float32), everything
    mean = finite.mean()
    std = np.sqrt(np.mean((finite - mean) ** 2))
    norm = np.sqrt(np.sum(finite * finite))
    floats = np.array([finite.min(), finite.max(), mean, std, norm], dtype=np.float32)
    return nan_count, inf_count, floats, everything


def stats(values: Any) -> Dict[str, Any]:
    """The statistics of a tensor summary: ``count`` includes NaN and ±inf; ``min``, ``max``,
    ``mean``, ``std`` (population) and ``l2_norm`` are over the finite values, computed in
    float64 and rounded to float32 once; all 0 when no value is finite."""
    x = as_f32(values)
    nan_count, inf_count, floats = stat_numbers(x)
    return {"count": int(x.size), **{name: f32(v) for name, v in zip(STAT_FLOATS, floats)},
            "nan_count": nan_count, "inf_count": inf_count}


@dataclass
class Summary:
    """The numbers of a tensor summary before they are written: its float32 values in one
    array, so that a writer turns many summaries' floats into text at once."""

    shape: List[int]
    dtype: str
    count: int
    nan_count: int
    inf_count: int
    #: ``min``, ``max``, ``mean``, ``std``, ``l2_norm``; with a digest then the sketch, the
    #: head and the tail (``samples`` values each).
    floats: np.ndarray
    fingerprint: Optional[str] = None
    samples: int = 0
    #: Where the full tensor was saved (``file``, ``tensor``).
    capture: Optional[Dict[str, str]] = None

    def as_dict(self) -> Dict[str, Any]:
        """The summary as the trace holds it, floats as :func:`f32` gives them."""
        values = [f32(v) for v in self.floats]
        summary: Dict[str, Any] = {
            "shape": self.shape,
            "dtype": self.dtype,
            "stats": {"count": self.count, **dict(zip(STAT_FLOATS, values)),
                      "nan_count": self.nan_count, "inf_count": self.inf_count},
        }
        if self.fingerprint is not None:
            sketch_end = len(STAT_FLOATS) + SKETCH_DIM
            summary["fingerprint"] = self.fingerprint
            summary["sketch"] = values[len(STAT_FLOATS):sketch_end]
            if self.samples:
                summary["head"] = values[sketch_end:sketch_end + self.samples]
                summary["tail"] = values[sketch_end + self.samples:]
        if self.capture is not None:
            summary["capture"] = self.capture
        return summary

    def json(self, texts: FloatTexts, offset: int) -> str:
        """The summary's JSON text, the bytes ``dumps(self.as_dict())`` gives, from the JSON
        texts of :attr:`floats`, at ``offset`` in ``texts``."""
        low, high, mean, std, norm = (texts[offset + i] for i in range(len(STAT_FLOATS)))
        text = (f'{{"shape":{dumps(self.shape)},"dtype":{dumps(self.dtype)},"stats":{{"count":{self.count},'
                f'"min":{low},"max":{high},"mean":{mean},"std":{std},"l2_norm":{norm},'
                f'"nan_count":{self.nan_count},"inf_count":{self.inf_count}}}')
        if self.fingerprint is not None:
            sketch = offset + len(STAT_FLOATS)
            head = sketch + SKETCH_DIM
            tail = head + self.samples
            text += f',"fingerprint":"{self.fingerprint}","sketch":[{texts.span(sketch, head)}]'
            if self.samples:
                text += f',"head":[{texts.span(head, tail)}],"tail":[{texts.span(tail, tail + self.samples)}]'
        if self.capture is not None:
            text += f',"capture":{dumps(self.capture)}'
        return text + "}"


def tensor_summary(values: Any, shape: Optional[Sequence[int]] = None, dtype: str = "f32", digest: bool = True) -> Summary:
    """The :class:`Summary` of ``values`` (read row-major as float32; ``shape`` is theirs
    unless given)."""
    array = np.asarray(values)
    x = as_f32(array)
    nan_count, inf_count, floats, x64 = _statistics(x)
    result = Summary([int(d) for d in (shape if shape is not None else array.shape)], dtype, int(x.size),
                     nan_count, inf_count, floats)
    if digest:
        result.fingerprint = fingerprint(x)
        result.samples = min(SAMPLE_LEN, x.size)
        sketched = _sketch(x64) if x64 is not None else sketch(x)
        result.floats = np.concatenate([floats, sketched, x[:result.samples], x[x.size - result.samples:]])
    return result


def summarize(values: Any, shape: Optional[Sequence[int]] = None, dtype: str = "f32", digest: bool = True) -> Dict[str, Any]:
    """A tensor summary (the ``tensor`` of a stage, ``probs``, ``logits``) of ``values``."""
    return tensor_summary(values, shape, dtype, digest).as_dict()


def f32(value: Any) -> Any:
    """A float as written in a trace: the shortest decimal of its float32 value as a number, or
    ``"NaN"``, ``"inf"``, ``"-inf"``."""
    v = np.float32(value)
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    # The float64 nearest the shortest decimal of the float32: JSON then prints that decimal.
    return float(np.format_float_positional(v, unique=True, trim="-")) if v != 0 else float(v)


def read_float(value: Any) -> float:
    """A float read from a trace (a number or one of the three names) as a float32 value."""
    if isinstance(value, str):
        return {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf}[value]
    return float(np.float32(value))


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    """One line of a trace: JSON with the ``event`` key first, no NaN or Infinity tokens."""
    return _ENCODER.encode(obj)


class TraceFormatError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


def read_trace(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The header and the events of a trace file, as dicts. A cut last line is ignored (it is
    what a crash leaves); any other bad line is a :class:`TraceFormatError`."""
    with open(path, "r", encoding="utf-8") as file:
        lines = file.read().split("\n")
    complete = lines[:-1]
    header: Optional[Dict[str, Any]] = None
    events: List[Dict[str, Any]] = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceFormatError(f"{path}:{number}: {error}") from None
        if header is None:
            if obj.get("format") != FORMAT_NAME:
                raise TraceFormatError(f"{path}:1: not a model-trace file")
            if int(obj.get("schema", 0)) > SCHEMA_VERSION:
                raise TraceFormatError(f"{path}:1: schema {obj['schema']} is newer than {SCHEMA_VERSION}")
            header = obj
        else:
            events.append(obj)
    if header is None:
        raise TraceFormatError(f"{path}: empty, not a trace file")
    return header, events


def iter_stages(events: Sequence[Dict[str, Any]]) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """Every (layer event, stage) of a trace's events."""
    for event in events:
        if event.get("event") == "layer":
            for stage in event["stages"]:
                yield event, stage
