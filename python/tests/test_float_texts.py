"""`model_trace.floats.float_texts` (whole arrays at once) writes every float32 as
`model_trace.format.f32_text` does one at a time: the shortest decimal that reads back, in the
Rust writer's (serde_json's) layout, or the name of a non-finite value; with orjson and with
its own arithmetic alike."""

import json

import numpy as np
import pytest

import model_trace.floats
from model_trace.floats import float_texts, integer_texts
from model_trace.format import f32_text, read_float


@pytest.fixture(params=["orjson", "arithmetic"], autouse=True)
def formatter(request, monkeypatch):
    """Every test runs with orjson's formatter (skipped where it is not installed) and with the
    arithmetic on arrays."""
    if request.param == "orjson":
        if model_trace.floats._orjson is None:
            pytest.skip("orjson is not installed, or writes floats another way")
    else:
        monkeypatch.setattr(model_trace.floats, "_orjson", None)
    return request.param


def one_at_a_time(values):
    return [f32_text(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]


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
              9.9999e-5, 1e-5, 1.5e-5, -1.2345678e-5, 1e-14, 9.99999e-15, 1e-6, 9.99999e-7, 1e-7, 1e12,
              9.999999e12, 1e13, -1.5e13]
    assert_same_texts(values)
    assert_same_texts(np.full(5, np.nan))
    assert_same_texts([np.nan, 1.5, -np.inf, 2.5e-7, np.inf])
    assert_same_texts([])


def test_the_layout_of_serde_json():
    """The texts the Rust writer writes for these values (serde_json 1.0.154, its zmij formatter)."""
    values = [1.0, 0.1, 1e-5, 1.5e-5, 1e-6, 1.234e-6, 1e-7, 4.8145106e-9, 123456789.0, 1e12, 1e13, 1.2345e15,
              3.4028235e38, 1e-45, -0.0, 0.0, -2.5, 16777217.0]
    assert float_texts(values).span(0, len(values)).split(",") == [
        "1.0", "0.1", "0.00001", "0.000015", "0.000001", "0.000001234", "1e-7", "4.8145106e-9", "123456790.0",
        "1000000000000.0", "1e+13", "1.2345e+15", "3.4028235e+38", "1e-45", "-0.0", "0.0", "-2.5", "16777216.0"]


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
    assert texts.span(1, 4) == "7,-7,10" and integer_texts([]).span(0, 0) == "" and len(integer_texts([])) == 0
    with pytest.raises(ValueError):
        integer_texts([10**16])
