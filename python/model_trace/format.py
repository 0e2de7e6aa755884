"""The model-trace file format (docs/trace-format.md): tensor summaries computed exactly as the
Rust runtime computes them, the lossless encoding of floats, and a reader.

Everything here needs only numpy (and the ``blake3`` package for fingerprints).
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

# How numbers are written as text (f32_text one float, NumberTexts many at once) is floats.py's;
# f32_text is importable from here too, where it was first defined.
from .floats import NumberTexts, f32_text  # noqa: F401

FORMAT_NAME = "model-trace"
SCHEMA_VERSION = 3
SKETCH_DIM = 8
SKETCH_SEED = 0x6D646C7472616365
SAMPLE_LEN = 4

_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


class _Scratch(threading.local):
    """Arrays a thread reuses for summaries. A layer's worth of values in float64 is past
    glibc's threshold for giving memory back when it is freed, so a fresh array of that size
    is page-faulted in every time, which cost several times the arithmetic done in it."""

    #: The largest array kept (a larger one is made for each use).
    LIMIT_BYTES = 32 << 20

    def __init__(self) -> None:
        self.arrays: Dict[str, np.ndarray] = {}

    def array(self, name: str, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` for the use ``name`` (its contents undefined)."""
        size = math.prod(shape)
        if size * np.dtype(dtype).itemsize > self.LIMIT_BYTES:
            return np.empty(shape, dtype=dtype)
        kept = self.arrays.get(name)
        if kept is None or kept.size < size or kept.dtype != dtype:
            kept = self.arrays[name] = np.empty(size, dtype=dtype)
        return kept[:size].reshape(shape)


_scratch = _Scratch()


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


#: Bytes of sign patterns kept for reuse (tensors of one model come in a few lengths).
PATTERNS_CACHE_BYTES = 32 << 20
_patterns_cache: "OrderedDict[int, np.ndarray]" = OrderedDict()
_patterns_lock = threading.Lock()  # sessions of several threads share the cache
#: ``s_k`` for each of the 256 sign patterns (``[256, 8]``).
_PATTERN_SIGNS = 1.0 - 2.0 * ((np.arange(256)[:, None] >> np.arange(SKETCH_DIM)) & 1)


def sign_patterns(n: int) -> np.ndarray:
    """The signs of element ``i`` in ``0..n`` as one number: bit ``k`` is set where
    ``s_k(i) = −1``, which makes it the low byte of ``h(i)`` (read-only: the last lengths asked
    for are kept, up to ``PATTERNS_CACHE_BYTES``)."""
    with _patterns_lock:
        patterns = _patterns_cache.get(n)
        if patterns is not None:
            _patterns_cache.move_to_end(n)
            return patterns
    patterns = (element_hashes(n) & np.uint64(0xFF)).astype(np.intp)
    patterns.flags.writeable = False
    if patterns.nbytes <= PATTERNS_CACHE_BYTES:
        with _patterns_lock:
            _patterns_cache[n] = patterns
            while sum(cached.nbytes for cached in _patterns_cache.values()) > PATTERNS_CACHE_BYTES:
                _patterns_cache.popitem(last=False)
    return patterns


_pattern_counts: Dict[int, int] = {}


def _largest_pattern_count(n: int) -> int:
    """How many of the elements ``0..n`` have the commonest sign pattern."""
    count = _pattern_counts.get(n)
    if count is None:
        count = _pattern_counts[n] = int(np.bincount(sign_patterns(n), minlength=256).max())
    return count


#: Lengths up to which the signs of each component are kept in float64 (``[8, n]``).
_SIGNS_KEPT_UP_TO = 1 << 16
_signs_cache: "OrderedDict[int, np.ndarray]" = OrderedDict()


def _component_signs(n: int, components: np.ndarray) -> np.ndarray:
    """``s_k(i)`` for each ``k`` of ``components`` and ``i`` in ``0..n``, float64
    ``[len(components), n]`` (those of the last few short lengths kept)."""
    if n > _SIGNS_KEPT_UP_TO:
        return _PATTERN_SIGNS[sign_patterns(n)[None, :], components[:, None]]
    with _patterns_lock:
        signs = _signs_cache.get(n)
        if signs is not None:
            _signs_cache.move_to_end(n)
    if signs is None:
        signs = np.ascontiguousarray(sketch_signs(n))
        signs.flags.writeable = False
        with _patterns_lock:
            _signs_cache[n] = signs
            while len(_signs_cache) > 8:
                _signs_cache.popitem(last=False)
    return signs[components]


_block_patterns_cache: "OrderedDict[Tuple[int, int], np.ndarray]" = OrderedDict()


def _block_patterns(n: int, rows: int) -> np.ndarray:
    """For a block of ``rows`` rows of ``n`` values, flattened: the sign pattern of each value
    plus 256 times its row, so that one ``bincount`` sums every row's patterns (the last few
    blocks' kept: a model's tensors come in a few lengths)."""
    key = (n, rows)
    with _patterns_lock:
        found = _block_patterns_cache.get(key)
        if found is not None:
            _block_patterns_cache.move_to_end(key)
            return found
    found = (sign_patterns(n)[None, :] + 256 * np.arange(rows)[:, None]).reshape(-1)
    found.flags.writeable = False
    with _patterns_lock:
        _block_patterns_cache[key] = found
        while len(_block_patterns_cache) > 4:
            _block_patterns_cache.popitem(last=False)
    return found


def sketch_signs(n: int) -> np.ndarray:
    """``s_k(i)`` of the sketch's definition for ``k`` in ``0..8`` and ``i`` in ``0..n``, as a
    float64 array ``[8, n]`` of ±1."""
    return _PATTERN_SIGNS[sign_patterns(n)].T


def sketch(values: Any) -> np.ndarray:
    """The 8-component sketch, bit for bit as the Rust runtime computes it: per component the
    sum, in float64 and in index order, of ``±x_i`` over the finite values, rounded to float32."""
    x = as_f32(values)
    finite = np.where(np.isfinite(x), x, np.float32(0)).astype(np.float64)[None, :]
    return _sketches(finite, np.add.reduce(np.abs(finite), axis=1))[0]


#: The unit roundoff of float64.
_UNIT_ROUNDOFF = 2.0**-53


def _sketches(values: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """The sketch of each row of ``values`` (float64 of float32 values, the non-finite
    replaced by 0), ``[rows, 8]``, without adding in index order where the order cannot change
    the float32 result; ``magnitude``: for each row, ``Σ|x_i|`` or more.

    Any order of adding ``n`` terms is within ``(n − 1)·u·Σ|t_i|`` of the exact sum (``u`` the
    unit roundoff, to first order, which the margin below covers; ``±x`` times ±1 is exact, so a
    fused multiply-add rounds as an addition does). Here each sign pattern's values are added
    in order (``bincount``, at most ``m`` of them), then the 256 patterns' sums with their
    signs: within ``(m − 1 + 255)·u·Σ|t_i|`` of the exact sum, so within
    ``(n + m + 253)·u·Σ|t_i|`` of the sum in index order. Where no float32 rounding boundary
    lies that close, both round to the same float32; the other components are added in order
    (``np.cumsum``; ``np.sum`` is pairwise)."""
    rows, n = values.shape
    if n == 0:
        return np.zeros((rows, SKETCH_DIM), dtype=np.float32)
    patterns = sign_patterns(n)
    # The sum of each sign pattern's values, then ±1 times those: eight sums in one pass, and
    # no matrix product (BLAS would start threads that keep spinning after it returns and take a
    # core from the traced model's own threads).
    if rows == 1:
        by_pattern = np.bincount(patterns, weights=values[0], minlength=256)[None, :]
    else:
        by_pattern = np.bincount(_block_patterns(n, rows), weights=values.reshape(-1),
                                 minlength=256 * rows).reshape(rows, 256)
    sums = np.einsum("rp,pk->rk", by_pattern, _PATTERN_SIGNS)
    rounded = sums.astype(np.float32)
    below = (rounded.astype(np.float64) + np.nextafter(rounded, np.float32(-np.inf)).astype(np.float64)) / 2
    above = (rounded.astype(np.float64) + np.nextafter(rounded, np.float32(np.inf)).astype(np.float64)) / 2
    # 1% more: room for the rounding of the bound's own sum and of the differences below.
    bound = (1.01 * _UNIT_ROUNDOFF * (n + _largest_pattern_count(n) + 256) * magnitude)[:, None]
    in_doubt = np.nonzero(~((sums - below > bound) & (above - sums > bound)))
    if in_doubt[0].size * n <= 1 << 20:
        terms = np.multiply(_component_signs(n, in_doubt[1]), values[in_doubt[0]])
        rounded[in_doubt] = np.cumsum(terms, axis=1)[:, -1].astype(np.float32)
    else:
        for row, component in zip(*in_doubt):
            rounded[row, component] = np.float32(np.cumsum(_PATTERN_SIGNS[patterns, component] * values[row])[-1])
    # In order from +0.0, a sum of zeros is +0.0; in another order it may be -0.0.
    rounded[rounded == 0] = 0.0
    return rounded


#: The bits every NaN is fingerprinted and captured as: the quiet NaN with no payload, sign
#: clear (any sign and payload of the model's NaN is lost).
CANONICAL_NAN = 0x7FC00000


def fingerprint(values: Any) -> str:
    """BLAKE3 of the values as float32 little-endian bytes, as 64 hex digits, every NaN (any
    sign, any payload, quiet or signalling) hashed as the bits ``0x7fc00000``."""
    x = as_f32(values)
    return _hash(canonical_nan(x) if x.size and np.isnan(np.min(x)) else x)


def _hash(x: np.ndarray) -> str:
    """BLAKE3 of a contiguous float32 array's little-endian bytes, as 64 hex digits."""
    return _blake3(x.astype("<f4", copy=False).view(np.uint8)).hexdigest()


def canonical_nan(values: np.ndarray) -> np.ndarray:
    """A copy of a float32 array with every NaN replaced by the bits ``0x7fc00000``."""
    bits = np.array(values, dtype=np.float32).view(np.uint32)
    bits[np.isnan(values)] = CANONICAL_NAN
    return bits.view(np.float32)


def _blake3(data: Any) -> Any:
    import blake3

    return blake3.blake3(data)


#: Names of the floats of the statistics, in the order of :attr:`Summary.floats`.
STAT_FLOATS = ("min", "max", "mean", "std", "l2_norm")


def stat_numbers(values: Any) -> Tuple[int, int, np.ndarray]:
    """``nan_count``, ``inf_count`` and the float32 array of ``min``, ``max``, ``mean``,
    ``std`` and ``l2_norm`` (see :func:`stats`)."""
    x = as_f32(values)
    nan_count, inf_count, floats, _, _ = _statistics(x[None, :])
    return int(nan_count[0]), int(inf_count[0]), floats[0]


def _statistics(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The statistics of each row of a float32 array ``[rows, n]``: ``nan_count``,
    ``inf_count``, the float32 ``[rows, 5]`` of :data:`STAT_FLOATS`, the rows in float64 with
    the non-finite values replaced by 0 (what the sketch adds), and their L2 norms in float64."""
    rows, n = x.shape
    values = _scratch.array("values", x.shape, np.float64)
    with np.errstate(invalid="ignore"):  # a signalling NaN becomes a quiet one
        values[...] = x
    nan_count = np.zeros(rows, dtype=np.int64)
    inf_count = np.zeros(rows, dtype=np.int64)
    floats = np.zeros((rows, len(STAT_FLOATS)), dtype=np.float32)
    norms = np.zeros(rows)
    if n == 0:
        return nan_count, inf_count, floats, values, norms
    low, high = x.min(axis=1), x.max(axis=1)  # NaN where a value is
    finite_rows = np.isfinite(low) & np.isfinite(high)
    whole = np.flatnonzero(finite_rows)
    if whole.size:
        finite = values if whole.size == rows else values[whole]
        work = _scratch.array("work", finite.shape, np.float64)
        # np.mean is this pairwise sum divided by the count.
        mean = np.add.reduce(finite, axis=1) / n
        np.subtract(finite, mean[:, None], out=work)
        std = np.sqrt(np.add.reduce(np.multiply(work, work, out=work), axis=1) / n)
        norm = np.sqrt(np.add.reduce(np.multiply(finite, finite, out=work), axis=1))
        if whole.size == rows:
            for column, value in enumerate((low, high, mean, std, norm)):
                floats[:, column] = value
        else:
            floats[whole] = np.stack([low[whole], high[whole], mean, std, norm], axis=1)
        norms[whole] = norm
    for row in np.flatnonzero(~finite_rows):
        finite_mask = np.isfinite(x[row])
        nan_count[row] = np.isnan(x[row]).sum()
        inf_count[row] = n - nan_count[row] - finite_mask.sum()
        finite = values[row][finite_mask]
        if finite.size:
            mean = np.add.reduce(finite) / finite.size
            deviations = finite - mean
            norms[row] = np.sqrt(np.add.reduce(finite * finite))
            floats[row] = [finite.min(), finite.max(), mean,
                           np.sqrt(np.add.reduce(deviations * deviations) / finite.size), norms[row]]
        values[row][~finite_mask] = 0.0
    return nan_count, inf_count, floats, values, norms


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

    def json(self, texts: NumberTexts, offset: int) -> str:
        """The summary's JSON text as the Rust writer writes :meth:`as_dict`, from the JSON texts
        of :attr:`floats`, at ``offset`` in ``texts``."""
        count = len(STAT_FLOATS) + (SKETCH_DIM + 2 * self.samples if self.fingerprint is not None else 0)
        starts = texts.start_array[offset:offset + count + 1].tolist()
        joined = texts.joined

        def span(first: int, stop: int) -> str:
            return joined[starts[first]:starts[stop] - 1] if stop > first else ""

        low, high, mean, std, norm = (span(i, i + 1) for i in range(len(STAT_FLOATS)))
        text = (f'{{"shape":[{",".join(map(str, self.shape))}],"dtype":{encode_basestring_ascii(self.dtype)},'
                f'"stats":{{"count":{self.count},'
                f'"min":{low},"max":{high},"mean":{mean},"std":{std},"l2_norm":{norm},'
                f'"nan_count":{self.nan_count},"inf_count":{self.inf_count}}}')
        if self.fingerprint is not None:
            sketch = len(STAT_FLOATS)
            head = sketch + SKETCH_DIM
            tail = head + self.samples
            text += f',"fingerprint":"{self.fingerprint}","sketch":[{span(sketch, head)}]'
            if self.samples:
                text += f',"head":[{span(head, tail)}],"tail":[{span(tail, tail + self.samples)}]'
        if self.capture is not None:
            text += f',"capture":{dumps(self.capture)}'
        return text + "}"


def tensor_summary(values: Any, shape: Optional[Sequence[int]] = None, dtype: str = "f32", digest: bool = True) -> Summary:
    """The :class:`Summary` of ``values`` (read row-major as float32; ``shape`` is theirs
    unless given)."""
    array = np.asarray(values)
    return tensor_summaries([array], [dtype], digest, [shape if shape is not None else array.shape])[0]


#: Elements summarised in one block (of rows of one length): the block's float64 copies stay
#: in the core's cache between the operations over them.
BLOCK_ELEMENTS = 1 << 18


def tensor_summaries(arrays: Sequence[Any], dtypes: Sequence[str], digest: bool = True,
                     shapes: Optional[Sequence[Sequence[int]]] = None) -> List[Summary]:
    """The :class:`Summary` of each array, those of one length computed together, in blocks
    of about :data:`BLOCK_ELEMENTS`: one pass of array operations over each block (at the
    sizes of a forward pass's tensors, a summary's cost is mostly numpy's cost a call)."""
    flat = [as_f32(a) for a in arrays]
    shapes = shapes if shapes is not None else [np.shape(a) for a in arrays]
    by_length: Dict[int, List[int]] = {}
    for index, x in enumerate(flat):
        by_length.setdefault(x.size, []).append(index)
    made: List[Optional[Summary]] = [None] * len(flat)
    for n, members in by_length.items():
        step = max(1, BLOCK_ELEMENTS // max(n, 1))
        for first in range(0, len(members), step):
            _summarise_block(flat, members[first:first + step], n, shapes, dtypes, digest, made)
    return made  # type: ignore[return-value]


def _summarise_block(flat: Sequence[np.ndarray], members: Sequence[int], n: int, shapes: Sequence[Sequence[int]],
                     dtypes: Sequence[str], digest: bool, made: List[Optional[Summary]]) -> None:
    """The summaries of the arrays ``flat[i]`` for ``i`` in ``members``, all of ``n`` elements."""
    if len(members) == 1:
        block = flat[members[0]][None, :]
    else:
        block = np.stack([flat[i] for i in members], out=_scratch.array("block", (len(members), n), np.float32))
    nan_count, inf_count, floats, finite, norms = _statistics(block)
    samples = min(SAMPLE_LEN, n)
    if digest:
        # Σ|x| <= √n·‖x‖: the sketch's bound on its summation error without another pass.
        sketches = _sketches(finite, np.sqrt(n) * norms)
        floats = np.concatenate([floats, sketches, block[:, :samples], block[:, n - samples:]], axis=1)
    nans, infs = nan_count.tolist(), inf_count.tolist()
    for row, index in enumerate(members):
        summary = made[index] = Summary([int(d) for d in shapes[index]], dtypes[index], n, nans[row], infs[row],
                                        floats[row])
        if digest:
            summary.fingerprint = _hash(canonical_nan(block[row]) if nans[row] else block[row])
            summary.samples = samples


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
