"""The sketch is the float32 rounding of sums added in index order (docs/trace-format.md).
model_trace adds them in another order (a matrix product), which may round differently, and in
index order where the difference could show in the float32 result: these tests hold it to the
definition, numpy's np.cumsum."""

import numpy as np

import model_trace
from model_trace.format import _sketches, element_hashes, sign_patterns, sketch_signs, tensor_summaries


def in_order(values):
    """The definition, as docs/trace-format.md writes it in numpy."""
    x = np.asarray(values, dtype=np.float32).reshape(-1)
    finite = np.where(np.isfinite(x), x, 0).astype(np.float64)
    signs = sketch_signs(x.size).astype(np.float64)
    return np.cumsum(signs * finite, axis=1)[:, -1].astype(np.float32)


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


def test_wide_ranges_of_magnitude_round_as_added_in_order():
    rng = np.random.default_rng(5)
    for n in (1, 7, 8, 100, 4096, 50000):
        for _ in range(5):
            values = (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)
            assert bits(model_trace.sketch(values)) == bits(in_order(values)), n


def test_a_sum_on_a_float32_midpoint_is_added_in_order():
    """1 + 2^-24 is the midpoint between 1 and the next float32. In order, each tiny value
    added to it is lost (below half a float64 ulp) and the tie rounds to 1.0; in another order
    the tiny values add up to a float64 ulp first and the sum rounds up. Every component whose
    signs keep the midpoint is such a sum."""
    values = np.array([1.0, 2.0**-24] + [2.0**-54] * 4096, dtype=np.float32)
    signs = sketch_signs(values.size)
    terms = signs * values.astype(np.float64)
    near_midpoint = [k for k in range(8) if signs[k, 0] == signs[k, 1] and np.float32(terms[k].sum()) != np.float32(np.cumsum(terms[k])[-1])]
    assert near_midpoint, "no component sums to the midpoint in another order"
    finite = values.astype(np.float64)[None, :]
    assert bits(_sketches(finite, np.abs(finite).sum(axis=1))[0]) == bits(in_order(values))
    assert bits(model_trace.summarize(values)["sketch"]) == bits(in_order(values))


def test_summaries_of_a_block_of_rows_round_as_added_in_order():
    """tensor_summaries sketches the tensors of one length together, in blocks of rows, with a
    bound on the summation error from the rows' L2 norms: held to the definition row by row, on
    sums of every size and on rows with non-finite values."""
    rng = np.random.default_rng(11)
    for n in (3, 1000, 9216):
        arrays = [(rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32) for _ in range(40)]
        arrays[3][: min(n, 2)] = np.nan
        arrays[5][-1] = np.inf
        arrays[7][:] = 0.0
        for array, summary in zip(arrays, tensor_summaries(arrays, ["f32"] * len(arrays))):
            # (+ 0.0: the definition adds from +0.0; np.cumsum starts from the first term)
            assert bits(summary.floats[5:13]) == bits(in_order(array) + np.float32(0)), n


def test_zeros_sum_to_positive_zero():
    assert bits(model_trace.sketch(np.array([-0.0, 0.0, -0.0], dtype=np.float32))) == [0] * 8


def test_sign_patterns_are_the_hashes_low_bytes_cached_per_length():
    patterns = sign_patterns(1000)
    assert patterns is sign_patterns(1000) and not patterns.flags.writeable
    assert patterns.tolist() == [int(h) & 0xFF for h in element_hashes(1000)]
    assert (sketch_signs(1000) == np.where((patterns[None, :] >> np.arange(8)[:, None]) & 1, -1.0, 1.0)).all()
