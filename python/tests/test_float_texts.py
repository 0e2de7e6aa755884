"""`model_trace.floats.float_texts` (whole arrays at once) writes every float32 as
`model_trace.format.f32` does one at a time: the shortest decimal that reads back, in Python's
`repr` layout, or the name of a non-finite value."""

import json

import numpy as np
import pytest

from model_trace.floats import float_texts, integer_texts
from model_trace.format import dumps, f32, read_float


def one_at_a_time(values):
    return [dumps(f32(v)) for v in np.asarray(values, dtype=np.float32).reshape(-1)]


def assert_same_texts(values):
    texts = float_texts(values)
    expected = one_at_a_time(values)
    assert [texts[i] for i in range(len(texts))] == expected
    assert texts.span(0, len(texts)) == ",".join(expected)


def rng():
    return np.random.default_rng(20251125)


def test_random_bit_patterns():
    """Every float32 with equal chance: all exponents, subnormals, NaN payloads, infinities."""
    assert_same_texts(rng().integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32).view(np.float32))


@pytest.mark.parametrize("scale", [1e-12, 1e-6, 1e-3, 1.0, 1e3, 1e7, 1e15])
def test_values_of_every_magnitude(scale):
    assert_same_texts((rng().standard_normal(20000) * scale).astype(np.float32))


def test_attention_like_weights():
    assert_same_texts(rng().dirichlet(np.ones(16), size=1000).astype(np.float32))


def test_short_decimals_and_their_neighbours():
    """Values with few digits (0.1, 2.5, 1500) and the float32 on either side of them, where a
    shorter decimal than the neighbour's own digits may read back."""
    short = np.array([m * 10.0**e for m in (1, 2, 5, 25, 125, 999, 1001, 4096) for e in range(-16, 17)],
                     dtype=np.float32)
    up, down = np.nextafter(short, np.float32(np.inf)), np.nextafter(short, np.float32(0))
    assert_same_texts(np.concatenate([short, -short, up, down]))


def test_powers_of_two_and_of_ten():
    """A power of two has a nearer float32 below than above: the decimals that read back are
    not spread evenly around it."""
    twos = np.float32(2.0) ** np.arange(-149, 128).astype(np.float32)
    tens = np.array([10.0**e for e in range(-45, 39)], dtype=np.float32)
    values = np.concatenate([twos, tens])
    assert_same_texts(np.concatenate([values, -values, np.nextafter(values, np.float32(np.inf))]))


def test_special_values():
    values = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 1e-45, 3.4028235e38, 1e16, 9.999999e15, 1e-4,
              9.9999e-5, 1e-5, 1.5e-5, -1.2345678e-5, 1e-14, 9.99999e-15]
    assert_same_texts(values)
    assert_same_texts(np.full(5, np.nan))
    assert_same_texts([])


def test_texts_read_back_to_the_same_float32():
    values = rng().integers(0, 2**32, size=5000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    texts = float_texts(values)
    back = np.array([read_float(json.loads(texts[i])) for i in range(len(texts))], dtype=np.float32)
    finite = np.isfinite(values)
    assert (back[finite].view(np.uint32) == values[finite].view(np.uint32)).all()
    assert (np.isnan(back) == np.isnan(values)).all()


def test_integer_texts():
    values = [0, 7, -7, 10, 9999, 10000, 123456789, -10**15, 10**16 - 1]
    texts = integer_texts(values)
    assert [texts[i] for i in range(len(texts))] == [str(v) for v in values]
    assert texts.span(1, 4) == "7,-7,10" and integer_texts([]).span(0, 0) == ""
    with pytest.raises(ValueError):
        integer_texts([10**16])
