"""The JSON text of many float32 values at once, exactly as the Rust writer writes each one
(:func:`f32_text`: the shortest decimal that reads back to the same float32,
in serde_json's layout; ``"NaN"``, ``"inf"``, ``"-inf"`` for the others), without formatting
each value in Python: a trace holds tens of thousands of floats a forward pass, and numpy's
shortest-digit formatter costs microseconds a value.

With ``orjson`` (a dependency of the package), its float32 formatter writes
them (compiled, about 25 ns a value, serde_json's layout). It is used only when it writes a set
of probe values covering every case of the layout as :func:`f32_text` does.

Without it, the digits come from arithmetic on whole arrays. For a float32 ``x`` and a number
of significant digits ``p``, the two ``p``-digit decimals around ``x`` are ``n·10^k`` and
``(n + 1)·10^k``; each is made as the float64 nearest to it (one correctly rounded
multiplication or division by an exact power of ten) and kept when it reads back to ``x``. The
shortest ``p`` with a decimal that reads back wins (the nearer of the two when both do), which
is the rule of Steele & White's and numpy's Dragon4 (and serde_json's). A value whose decision
float64 cannot make with certainty (a decimal on the midpoint between two float32, two decimals
equally near, magnitudes whose powers of ten float64 does not hold exactly) is formatted the
slow way, value by value. The texts are then laid out as ASCII in one array, a row a value, four
digits at a time from a table, and joined; :func:`integer_texts` lays out integers the same way.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: 10**0 .. 10**22: every power of ten float64 holds exactly.
_POWERS = np.array([float(10**k) for k in range(23)])
#: For a decimal exponent ``k`` in -22..22 (index ``k + 22``): ``x * _UP[k] / _DOWN[k]`` is
#: ``x / 10**k``, one of the two operations being exact.
_UP = np.concatenate([_POWERS[:0:-1], np.ones(23)])
_DOWN = np.concatenate([np.ones(22), _POWERS])
#: Magnitudes made by arithmetic: every ``p``-digit decimal of them (p <= 9) is ``n·10^k`` with
#: ``|k| <= 22``.
_LOW, _HIGH = 1e-14, 1e16
#: Significant digits that always tell float32 values apart.
_MAX_DIGITS = 9
#: 10**0 .. 10**18 as int64.
_INT_POWERS = 10 ** np.arange(19, dtype=np.int64)
#: ASCII of "0000" .. "9999", each as a little-endian uint32: four characters in one cell.
_QUADS = np.array([int.from_bytes(f"{i:04d}".encode(), "little") for i in range(10000)], dtype=np.uint32)
#: Masks of a cell keeping its first / its last 0..4 characters.
_FIRST = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], dtype=np.uint32)
_LAST = np.array([0, 0xFF000000, 0xFFFF0000, 0xFFFFFF00, 0xFFFFFFFF], dtype=np.uint32)


#: The decimal exponents (of the leading digit) that the Rust writer writes without an exponent:
#: serde_json's float32 layout (its ``zmij`` formatter): ``0.000001``, ``123.5``, ``1000000000000.0``.
FIXED_EXPONENTS = range(-6, 13)


def f32_text(value: Any) -> str:
    """The JSON text of a float as the Rust writer writes it (serde_json): the shortest decimal
    that reads back to the same float32, ``d.ddd`` times a power of ten written out for leading
    digits at 10^-6 .. 10^12 (``0.000012``, ``1.5``, ``1500.0``), else with an exponent
    (``1.5e-7``, ``1e+13``, ``-4.2e+38``); ``"NaN"``, ``"inf"``, ``"-inf"`` for the others.
    One value at a time (numpy's Dragon4 gives the digits): :func:`float_texts` writes whole
    arrays the same way."""
    v = np.float32(value)
    if not np.isfinite(v):
        return '"NaN"' if np.isnan(v) else ('"inf"' if v > 0 else '"-inf"')
    sign = "-" if np.signbit(v) else ""
    if v == 0:
        return sign + "0.0"
    mantissa, exponent = np.format_float_scientific(abs(v), unique=True, trim="-").split("e")
    digits, leading = mantissa.replace(".", ""), int(exponent)
    if leading not in FIXED_EXPONENTS:
        fraction = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{fraction}e{'+' if leading >= 0 else '-'}{abs(leading)}"
    if leading < 0:
        return f"{sign}0.{'0' * (-leading - 1)}{digits}"
    whole = digits[:leading + 1].ljust(leading + 1, "0")
    return f"{sign}{whole}.{digits[leading + 1:] or '0'}"


class NumberTexts:
    """The JSON texts of numbers, joined by commas in one string: ``texts[i]`` is number
    ``i``'s, ``texts.span(a, b)`` those of numbers ``a`` to ``b - 1`` with their commas."""

    def __init__(self, joined: str, starts: np.ndarray):
        self.joined = joined
        #: Where each number's text starts in ``joined``, and one past the last comma (an array;
        #: :attr:`starts` the same as a list, faster to index one by one).
        self.start_array = starts
        self._starts: Optional[List[int]] = None
        self._ascii: Any = None

    @property
    def starts(self) -> List[int]:
        """:attr:`start_array` as a list (made when first asked for)."""
        if self._starts is None:
            self._starts = self.start_array.tolist()
        return self._starts

    def __len__(self) -> int:
        return len(self.start_array) - 1

    def ascii(self) -> np.ndarray:
        """:attr:`joined` as an array of bytes."""
        if self._ascii is None:
            self._ascii = np.frombuffer(self.joined.encode("ascii"), dtype=np.uint8)
        return self._ascii

    def __getitem__(self, index: int) -> str:
        return self.joined[self.starts[index]:self.starts[index + 1] - 1]

    def span(self, start: int, stop: int) -> str:
        return self.joined[self.starts[start]:self.starts[stop] - 1] if stop > start else ""


def float_texts(values: Any) -> NumberTexts:
    """The JSON text of each value, read as float32, row-major: :func:`f32_text`."""
    x = np.ascontiguousarray(np.asarray(values, dtype=np.float32)).reshape(-1)
    if x.size == 0:
        return NumberTexts("", np.zeros(1, dtype=np.int64))
    if _orjson is not None:
        return _orjson_texts(x)
    magnitude = np.abs(x)
    arithmetic = np.flatnonzero((magnitude >= _LOW) & (magnitude < _HIGH))
    shortest, power, certain = _shortest_decimals(magnitude[arithmetic])
    digits = np.zeros(x.size, dtype=np.int64)
    exponent = np.zeros(x.size, dtype=np.int64)
    digits[arithmetic] = shortest
    exponent[arithmetic] = power
    laid_out = x == 0  # 0.0 and -0.0: digits 0
    laid_out[arithmetic[certain]] = True
    other_texts = {int(i): f32_text(x[i]) for i in np.flatnonzero(~laid_out)}
    return _join(laid_out, digits, exponent, np.signbit(x), other_texts)


def integer_texts(values: Any) -> NumberTexts:
    """The JSON text of each integer (``str(v)``), below 10**16 in magnitude."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    magnitude = np.abs(values)
    if magnitude.size and magnitude.max() >= _INT_POWERS[16]:
        raise ValueError("model_trace: integers of 10**16 and beyond are not written here")
    if _orjson is not None and values.size:
        return _split(_orjson.dumps(values, option=_orjson.OPT_SERIALIZE_NUMPY))
    count = np.maximum(np.searchsorted(_INT_POWERS, magnitude, side="right"), 1)
    width = 4 * -(-int(count.max(initial=1)) // 4)
    rows = np.zeros((values.size, width + 2), dtype=np.uint8)
    rows[:, 0] = np.where(values < 0, ord("-"), 0)
    _write_digits(rows[:, 1:-1], magnitude, count, right_aligned=True)
    rows[:, -1] = ord(",")
    lengths = (values < 0) + count + 1
    joined = rows.tobytes().translate(None, b"\0").decode("ascii")
    return NumberTexts(joined, np.concatenate([[0], np.cumsum(lengths)]))


def join_rows(rows: int, segments: Sequence[Any]) -> Tuple[str, np.ndarray]:
    """``rows`` texts made of the same segments, joined, and where each starts (``rows + 1``
    offsets). A segment is a ``str`` (the same in every row), an array of non-negative integers
    (one a row, written in decimal) or ``(source, starts, lengths)``: a piece of an ASCII array
    of bytes for each row. Laid out as the floats are: a row of bytes a text, NUL where unused,
    dropped when joined."""
    widths = []
    for segment in segments:
        if isinstance(segment, str):
            widths.append(len(segment))
        elif isinstance(segment, tuple):
            widths.append(int(segment[2].max(initial=0)))
        else:
            widths.append(4 * -(-int(np.searchsorted(_INT_POWERS, segment.max(initial=0), side="right")) // 4) or 4)
    out = np.zeros((rows, sum(widths)), dtype=np.uint8)
    lengths = np.zeros(rows, dtype=np.int64)
    column = 0
    for segment, width in zip(segments, widths):
        part = out[:, column:column + width]
        column += width
        if isinstance(segment, str):
            part[...] = np.frombuffer(segment.encode("ascii"), dtype=np.uint8)
            lengths += width
        elif isinstance(segment, tuple):
            source, starts, counts = segment
            if width:
                places = np.arange(width)
                chunk = source.take(starts[:, None] + places, mode="clip")
                np.multiply(chunk, places < counts[:, None], out=chunk)
                part[...] = chunk
                lengths += counts
        else:
            if segment.size and segment.min() < 0:
                raise ValueError("model_trace: join_rows writes non-negative integers")
            count = np.maximum(np.searchsorted(_INT_POWERS, segment, side="right"), 1)
            _write_digits(part, segment, count, right_aligned=True)
            lengths += count
    joined = out.tobytes().translate(None, b"\0").decode("ascii")
    return joined, np.concatenate([[0], np.cumsum(lengths)])


def _split(array_json: bytes) -> NumberTexts:
    """The texts of a JSON array of numbers (``b"[1.5,-2.0]"``, not empty)."""
    commas = np.flatnonzero(np.frombuffer(array_json, dtype=np.uint8) == ord(","))
    return NumberTexts(array_json[1:-1].decode("ascii") + ",",
                       np.concatenate([[0], commas, [len(array_json) - 1]]))


def _orjson_texts(x: np.ndarray) -> NumberTexts:
    """:func:`float_texts` of a non-empty float32 array by orjson (which writes ``null`` for the
    non-finite values: those are written as zeros, then their texts replaced)."""
    finite = np.isfinite(x)
    if finite.all():
        return _split(_orjson.dumps(x, option=_orjson.OPT_SERIALIZE_NUMPY))
    texts = _split(_orjson.dumps(np.where(finite, x, np.float32(0)), option=_orjson.OPT_SERIALIZE_NUMPY))
    replaced = {int(i): f32_text(x[i]) for i in np.flatnonzero(~finite)}
    pieces, lengths, last = [], np.diff(texts.start_array), 0
    for index, text in replaced.items():
        pieces += [texts.joined[texts.starts[last]:texts.starts[index]], text, ","]
        lengths[index] = len(text) + 1
        last = index + 1
    pieces.append(texts.joined[texts.starts[last]:])
    return NumberTexts("".join(pieces), np.concatenate([[0], np.cumsum(lengths)]))


def _shortest_decimals(magnitude: np.ndarray):
    """For positive float32 values in [_LOW, _HIGH): the shortest decimal ``digits·10^exponent``
    that reads back to each, and whether it was decided with certainty."""
    value = magnitude.astype(np.float64)
    leading = np.floor(np.log10(value)).astype(np.int64)
    first = _scaled(value, leading)
    leading += (first >= 10).astype(np.int64) - (first < 1).astype(np.int64)
    first = _scaled(value, leading)
    # A float32 within rounding of a power of ten it is not: the leading digit's place is unsure.
    certain = (first >= 1) & (first < 10) & ~((np.abs(first - 1) < 1e-13) & (first != 1))
    digits = np.zeros(value.size, dtype=np.int64)
    exponent = np.zeros(value.size, dtype=np.int64)

    def try_places(places: int, which: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Records the decimals of ``places`` digits that read back; the indices of the values
        that have one and of those that surely have none."""
        found, sure, n, k = _nearest_reading_back(value[which], magnitude[which], leading[which] - places + 1)
        certain[which[~sure]] = False
        keep = found & sure
        digits[which[keep]] = n[keep]
        exponent[which[keep]] = k[keep]
        return which[keep], which[~found & sure]

    # The numbers of digits that read back are p0..9 for some p0 (a finer grid keeps the
    # decimals that read back), and most float32 need 7 to 9: 8 first, then 9 or 7, then the
    # few shorter ones at every count from 6 down to 1 at once.
    shorter, longest = try_places(_MAX_DIGITS - 1, np.flatnonzero(certain))
    certain[try_places(_MAX_DIGITS, longest)[1]] = False  # only an unsure decision misses 9
    shorter = try_places(_MAX_DIGITS - 2, shorter)[0]
    if shorter.size:
        counts = np.arange(_MAX_DIGITS - 3, 0, -1)
        which = np.repeat(shorter, counts.size)
        found, sure, n, k = _nearest_reading_back(value[which], magnitude[which],
                                                  leading[which] - np.tile(counts, shorter.size) + 1)
        certain[shorter[~sure.reshape(-1, counts.size).all(axis=1)]] = False
        reading = found.reshape(-1, counts.size).sum(axis=1)  # counts.size + 1 - p0 of them
        has = np.flatnonzero(reading)
        shortest = has * counts.size + reading[has] - 1
        digits[shorter[has]] = n[shortest]
        exponent[shorter[has]] = k[shortest]
    # Only p = 1 can round up to a 0 digit (9.6 -> 10): the decimal is 1·10^(k+1).
    overflow = digits == 10
    digits[overflow] = 1
    exponent[overflow] += 1
    return digits, exponent, certain


def _scaled(value: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``value / 10**k``, rounded once."""
    return value * _UP[k + 22] / _DOWN[k + 22]


def _nearest_reading_back(value, magnitude, k):
    """Whether ``n·10^k`` or ``(n+1)·10^k`` (the decimals around ``value`` with that last
    place) reads back to ``magnitude``, whether that was decided with certainty, and the
    chosen ``n`` and ``k``."""
    up, down = _UP[k + 22], _DOWN[k + 22]
    scaled = value * up / down
    low = np.floor(scaled)
    fraction = scaled - low
    down_value = low * down / up
    up_value = (low + 1) * down / up
    down_ok = down_value.astype(np.float32) == magnitude
    up_ok = up_value.astype(np.float32) == magnitude
    # Reading back rounds to the nearest float32. The float64 nearest a decimal is on the
    # decimal's side of the midpoint between two float32, or on it: only landing on it (25
    # significant bits, the last set) leaves the side unknown.
    on_midpoint = _is_midpoint(down_value) | _is_midpoint(up_value)
    # `scaled` is within 1.2e-7 of the exact quotient (below 1e9, rounded once).
    tie = down_ok & up_ok & (np.abs(fraction - 0.5) < 1e-6)
    take_up = up_ok & (~down_ok | (fraction > 0.5))
    return down_ok | up_ok, ~(on_midpoint | tie), (low + take_up).astype(np.int64), k


def _is_midpoint(value: np.ndarray) -> np.ndarray:
    """Whether float64 values (in float32's normal range) lie halfway between two float32."""
    return (value.view(np.uint64) & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)


def _join(laid_out: np.ndarray, digits: np.ndarray, exponent: np.ndarray, negative: np.ndarray,
          other_texts: Dict[int, str]) -> NumberTexts:
    """The texts of ``±digits·10^exponent`` (``digits`` without trailing zeros) in serde_json's
    layout where ``laid_out`` (``0.0625``, ``1.5``, ``1500.0``, ``1.5e-7``, ``1e+13``), the
    ``other_texts`` elsewhere, joined."""
    if not laid_out.all():
        index = np.flatnonzero(laid_out)
        digits, exponent, negative = digits[index], exponent[index], negative[index]
    count = np.maximum(np.searchsorted(_INT_POWERS, digits, side="right"), 1)
    leading = count - 1 + exponent  # the power of ten of the first digit
    scientific = (leading < FIXED_EXPONENTS.start) | (leading >= FIXED_EXPONENTS.stop)
    # Scientific: one digit, then the others as the fraction, and an exponent.
    places = np.where(scientific, count - 1, np.maximum(-exponent, 0))
    scale = _INT_POWERS[places]
    whole = np.where(scientific, digits // scale, digits // scale * _INT_POWERS[np.maximum(exponent, 0)])
    fraction = digits % scale
    fraction_kept = np.where(scientific, places, np.maximum(places, 1))  # 1500.0, but 1e+13
    whole_digits = np.maximum(np.searchsorted(_INT_POWERS, whole, side="right"), 1)

    # A row of ASCII a value: sign, whole digits (right-aligned), point, fraction digits
    # (left-aligned), exponent, separator; unused characters NUL, dropped when joined.
    whole_width = 4 * -(-int(whole_digits.max(initial=1)) // 4)
    fraction_width = 4 * -(-int(fraction_kept.max(initial=1)) // 4)
    exponent_width = 4 if scientific.any() else 0
    width = whole_width + fraction_width + exponent_width + 3
    rows = np.zeros((digits.size, width), dtype=np.uint8)
    rows[:, 0] = np.where(negative, ord("-"), 0)
    _write_digits(rows[:, 1:1 + whole_width], whole, whole_digits, right_aligned=True)
    rows[:, 1 + whole_width] = np.where(fraction_kept > 0, ord("."), 0)
    _write_digits(rows[:, 2 + whole_width:2 + whole_width + fraction_width],
                  fraction * _INT_POWERS[fraction_width - places], fraction_kept, right_aligned=False)
    exponent_length = 0
    if exponent_width:
        # "e-7", "e+13": the sign always, no leading zero.
        size = np.abs(leading)
        two = size >= 10
        exponents = (ord("e") | np.where(leading < 0, ord("-"), ord("+")) << 8
                     | np.where(two, 48 + size // 10, 48 + size) << 16 | np.where(two, 48 + size % 10, 0) << 24)
        rows[:, -5:-1] = np.where(scientific, exponents, 0).astype("<u4").view(np.uint8).reshape(-1, 4)
        exponent_length = np.where(scientific, 3 + two, 0)
    rows[:, -1] = ord(",")
    lengths = np.zeros(laid_out.size, dtype=np.int64)
    lengths[laid_out] = negative + whole_digits + (fraction_kept > 0) + fraction_kept + exponent_length + 1
    if other_texts:
        longest = max(len(text) for text in other_texts.values()) + 1
        all_rows = np.zeros((laid_out.size, max(width, longest)), dtype=np.uint8)
        all_rows[laid_out, :width] = rows
        for index, text in other_texts.items():
            all_rows[index, :len(text) + 1] = np.frombuffer(text.encode("ascii") + b",", dtype=np.uint8)
            lengths[index] = len(text) + 1
        rows = all_rows
    joined = rows.tobytes().translate(None, b"\0").decode("ascii")
    return NumberTexts(joined, np.concatenate([[0], np.cumsum(lengths)]))


def _write_digits(chars: np.ndarray, values: np.ndarray, kept: np.ndarray, right_aligned: bool) -> None:
    """Writes the decimal digits of non-negative integers below ``10**chars.shape[1]`` into
    ``chars`` (a multiple of 4 wide), keeping the last ``kept`` digits of each (right-aligned)
    or the first ``kept``, the others NUL."""
    groups = chars.shape[1] // 4
    for group in range(groups):
        quad = _QUADS[values // _INT_POWERS[4 * (groups - 1 - group)] % 10000]
        if right_aligned:
            quad &= _LAST[np.clip(kept - 4 * (groups - 1 - group), 0, 4)]
        else:
            quad &= _FIRST[np.clip(kept - 4 * group, 0, 4)]
        chars[:, 4 * group:4 * group + 4] = quad.view(np.uint8).reshape(-1, 4)


#: Probe values: every case of the layout (fixed with and without a fraction, below 1, both
#: ends of the fixed range, exponents of one and two digits, both signs, subnormal, zeros).
_PROBES = np.array([1.0, 0.1, 1e-5, 1.5e-5, 1e-6, 1.234e-6, 9.9999e-7, 1e-7, 5e-7, 4.8145106e-9, 123456789.0,
                    1e12, 9.999999e12, 1e13, 1.2345e15, 1e16, 3.4028235e38, 1.4e-45, 1e-45, 1.17549435e-38,
                    -0.0, 0.0, 100.0, -2.5, 0.3, 16777217.0, 7.038531e-26, 9.2233720e18], dtype=np.float32)


def _usable_orjson() -> Any:
    """orjson, when it is installed and writes float32 values as :func:`f32_text` does."""
    try:
        import orjson
    except ImportError:
        return None
    try:
        texts = orjson.dumps(_PROBES, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii")
        integers = orjson.dumps(np.array([0, -7, 10**15], dtype=np.int64), option=orjson.OPT_SERIALIZE_NUMPY)
    except Exception:  # an orjson without numpy support
        return None
    if texts != "[" + ",".join(f32_text(v) for v in _PROBES) + "]" or integers != b"[0,-7,1000000000000000]":
        return None
    return orjson


_orjson = _usable_orjson()
