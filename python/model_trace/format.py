"""The model-trace file format (docs/trace-format.md): tensor summaries computed exactly as the
Rust runtime computes them, the lossless encoding of floats, and a reader.

Everything here needs only numpy (and the ``blake3`` package for fingerprints).
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

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


def sketch(values: Any) -> np.ndarray:
    """The 8-component sketch, bit for bit as the Rust runtime computes it: per component the
    sum, in float64 and in index order, of ``±x_i`` over the finite values, rounded to float32."""
    x = as_f32(values)
    if x.size == 0:
        return np.zeros(SKETCH_DIM, dtype=np.float32)
    bits = (element_hashes(x.size)[:, None] >> np.arange(SKETCH_DIM, dtype=np.uint64)) & np.uint64(1)
    signs = 1.0 - 2.0 * bits.astype(np.float64)
    finite = np.where(np.isfinite(x), x, np.float32(0)).astype(np.float64)
    # cumsum adds in order, as the definition asks; np.sum would add pairwise.
    return np.cumsum(signs * finite[:, None], axis=0)[-1].astype(np.float32)


def fingerprint(values: Any) -> str:
    """BLAKE3 of the values as float32 little-endian bytes, as 64 hex digits."""
    import blake3

    return blake3.blake3(as_f32(values).astype("<f4").tobytes()).hexdigest()


def stats(values: Any) -> Dict[str, Any]:
    """The statistics of a tensor summary: ``count`` includes NaN and ±inf; ``min``, ``max``,
    ``mean``, ``std`` (population) and ``l2_norm`` are over the finite values, computed in
    float64 and rounded to float32 once; all 0 when no value is finite."""
    x = as_f32(values)
    finite_mask = np.isfinite(x)
    nan_count = int(np.isnan(x).sum())
    inf_count = int(x.size - nan_count - finite_mask.sum())
    finite = x[finite_mask].astype(np.float64)
    if finite.size == 0:
        low = high = mean = std = norm = 0.0
    else:
        low, high = float(finite.min()), float(finite.max())
        mean = float(finite.mean())
        std = float(np.sqrt(np.mean((finite - mean) ** 2)))
        norm = float(np.sqrt(np.sum(finite * finite)))
    return {
        "count": int(x.size),
        "min": f32(low),
        "max": f32(high),
        "mean": f32(mean),
        "std": f32(std),
        "l2_norm": f32(norm),
        "nan_count": nan_count,
        "inf_count": inf_count,
    }


def summarize(values: Any, shape: Optional[Sequence[int]] = None, dtype: str = "f32", digest: bool = True) -> Dict[str, Any]:
    """A tensor summary (the ``tensor`` of a stage, ``probs``, ``logits``) of ``values``."""
    array = np.asarray(values)
    x = as_f32(array)
    summary: Dict[str, Any] = {
        "shape": [int(d) for d in (shape if shape is not None else array.shape)],
        "dtype": dtype,
        "stats": stats(x),
    }
    if digest:
        summary["fingerprint"] = fingerprint(x)
        summary["sketch"] = [f32(v) for v in sketch(x)]
        if x.size:
            summary["head"] = [f32(v) for v in x[:SAMPLE_LEN]]
            summary["tail"] = [f32(v) for v in x[max(0, x.size - SAMPLE_LEN):]]
    return summary


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


def dumps(obj: Dict[str, Any]) -> str:
    """One line of a trace: JSON with the ``event`` key first, no NaN or Infinity tokens."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


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
