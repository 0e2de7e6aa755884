"""`model_trace.attention.attention_rows` (array operations over the whole tensor, numpy in host
memory, torch on a device) against the format's definition applied row by row: top-k of the
finite weights > 0 and >= the threshold, heaviest first and the lower position first on ties;
tail mass; entropy; sink weight. The torch operations run here on the CPU, as they would on a
GPU."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from model_trace.attention import _analyse, _Torch, attention_rows  # noqa: E402  (after the skip)
from model_trace.format import f32  # noqa: E402

BACKENDS = {
    "numpy": attention_rows,
    "torch": lambda probs, top_k, threshold: _analyse(torch.as_tensor(probs, dtype=torch.float32), top_k, threshold,
                                                      _Torch(torch, "cpu")),
}


@pytest.fixture(params=sorted(BACKENDS))
def analyse(request):
    return BACKENDS[request.param]


def row_by_definition(w, top_k, threshold):
    """One row as docs/trace-format.md defines it, element by element."""
    w = np.asarray(w, dtype=np.float32)
    floor = max(np.float32(threshold), np.float32(1.4e-45))
    candidates = [i for i in range(w.size) if math.isfinite(w[i]) and w[i] >= floor]
    kept = sorted(candidates, key=lambda i: (-w[i], i))[:top_k]
    normal = [float(v) for v in w if math.isfinite(v) and v >= np.finfo(np.float32).tiny]
    total = math.fsum(normal)
    entropy = -math.fsum(v * math.log(v) for v in normal)
    return {
        "top_k_positions": kept,
        "top_k_weights": [f32(w[i]) for i in kept],
        "tail_mass": max(total - math.fsum(float(w[i]) for i in kept), 0.0),
        "entropy": max(entropy, 0.0),
        "sink_weight": f32(w[0]) if w.size and math.isfinite(w[0]) and w[0] > 0 else 0.0,
    }


def check(analyse, probs, top_k=10, threshold=0.01):
    rows = analyse(probs, top_k, threshold)
    array = np.asarray(torch.as_tensor(probs), dtype=np.float32)
    flat = array.reshape(-1, array.shape[-1])
    records = list(rows.records(layer=3))
    assert len(records) == flat.shape[0]
    q_len = array.shape[-2] if array.ndim >= 2 else 1
    for index, (record, weights) in enumerate(zip(records, flat)):
        expected = row_by_definition(weights, top_k, threshold)
        assert record["layer_idx"] == 3 and record["num_keys"] == array.shape[-1]
        assert record["query_pos"] == array.shape[-1] - q_len + index % q_len
        for key in ("top_k_positions", "top_k_weights", "sink_weight"):
            assert record[key] == expected[key], (index, key, record[key], expected[key])
        # Sums in float64, in another order than math.fsum's exact one.
        assert record["tail_mass"] == pytest.approx(expected["tail_mass"], rel=1e-6, abs=1e-12), index
        assert record["entropy"] == pytest.approx(expected["entropy"], rel=1e-6, abs=1e-12), index
    return records


def test_softmax_rows_of_a_causal_prefill(analyse):
    scores = torch.randn(2, 3, 6, 9, generator=torch.Generator().manual_seed(0)) * 3
    mask = torch.triu(torch.full((6, 9), float("-inf")), diagonal=4)
    records = check(analyse, torch.softmax(scores + mask, dim=-1))
    assert [(r["batch"], r["head_idx"]) for r in records[::6]] == [(b, h) for b in range(2) for h in range(3)]


def test_ties_go_to_the_lower_position_and_the_threshold_holds(analyse):
    probs = np.array([[0.25, 0.125, 0.25, 0.005, 0.25, 0.125, 0.0]], dtype=np.float32)
    records = check(analyse, probs, top_k=4, threshold=0.01)
    assert records[0]["top_k_positions"] == [0, 2, 4, 1]
    check(analyse, probs, top_k=10, threshold=0.2)
    check(analyse, probs, top_k=10, threshold=0.0)


def test_broken_rows(analyse):
    probs = np.array([
        [np.nan, 0.5, np.inf, 0.5, -np.inf, 0.0],
        [0.0, -0.5, 1e-39, 1e-45, 0.9, 0.1],
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ], dtype=np.float32)
    records = check(analyse, probs)
    assert records[0]["sink_weight"] == 0.0 and records[3]["entropy"] == 0.0
    check(analyse, probs, threshold=0.0)


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5), (1, 2, 3, 5), (2, 1, 1, 12)])
def test_leading_dimensions_default_to_one(analyse, shape):
    probs = torch.softmax(torch.randn(shape, generator=torch.Generator().manual_seed(1)), dim=-1)
    check(analyse, probs, top_k=3)


def test_more_kept_than_keys_and_top_k_zero(analyse):
    probs = torch.softmax(torch.randn(1, 2, 2, 3, generator=torch.Generator().manual_seed(2)), dim=-1)
    check(analyse, probs, top_k=10, threshold=0.0)
    assert all(r["top_k_positions"] == [] for r in check(analyse, probs, top_k=0))


def test_shapes_it_cannot_read_are_errors(analyse):
    with pytest.raises(ValueError, match="expected 1 to 4 dimensions"):
        analyse(np.zeros((1, 1, 1, 1, 2)), 10, 0.01)


def test_a_cpu_tensor_is_analysed_as_its_values():
    probs = torch.softmax(torch.randn(1, 2, 3, 5, generator=torch.Generator().manual_seed(3)), dim=-1)
    assert list(attention_rows(probs).records(0)) == list(attention_rows(probs.numpy()).records(0))
    half = probs.to(torch.bfloat16)
    assert list(attention_rows(half).records(0)) == list(attention_rows(half.float().numpy()).records(0))
