"""The fingerprint is BLAKE3 of the values as float32 little-endian bytes with every NaN (any
sign, any payload, quiet or signalling) as the bits 0x7fc00000 (docs/trace-format.md), and a
capture saves every NaN with those bits."""

import numpy as np
import pytest

import model_trace
from model_trace.format import tensor_summaries
from model_trace.writer import TraceWriter

#: 1.0, NaN, -NaN, a signalling NaN, -0.0, +inf.
VECTOR = np.array([0x3F800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x80000000, 0x7F800000], dtype=np.uint32)
CANONICAL = "d03df72855a09d83053c18f5164f3e6aa9906510ec4ab24c528f4026fc67a013"


def test_the_format_s_test_vector():
    values = VECTOR.view(np.float32)
    assert model_trace.fingerprint(values) == CANONICAL
    assert VECTOR.tolist()[2] == 0xFFC00000, "the input is left as it was"
    assert tensor_summaries([values], ["f32"])[0].fingerprint == CANONICAL
    raw = __import__("blake3").blake3(VECTOR.astype("<u4").tobytes()).hexdigest()
    assert raw.startswith("14c5180e") and raw != CANONICAL


def test_every_nan_is_hashed_alike_and_other_values_as_they_are():
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FC00001], dtype=np.uint32).view(np.float32)
    one = np.array([np.nan] * nans.size, dtype=np.float32)
    assert len({model_trace.fingerprint(nans), model_trace.fingerprint(one)}) == 1
    zeros = np.array([0.0, -0.0], dtype=np.float32)
    assert model_trace.fingerprint(zeros) != model_trace.fingerprint(np.zeros(2, dtype=np.float32))
    values = np.array([1.5, -2.0, np.inf], dtype=np.float32)
    assert model_trace.fingerprint(values) == __import__("blake3").blake3(values.astype("<f4").tobytes()).hexdigest()


def test_a_capture_saves_every_nan_as_the_canonical_nan(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    values = VECTOR.view(np.float32).reshape(2, 3)
    writer = TraceWriter(str(tmp_path / "t.ndjson"), capture="*")
    writer.begin_pass(0)
    writer.begin_layer(0, "layer", "layer.0")
    writer.stage("output", values, wants_capture=True)
    writer.end_layer()
    writer.close()
    _, events = model_trace.read_trace(str(tmp_path / "t.ndjson"))
    tensor = next(e for e in events if e["event"] == "layer")["stages"][0]["tensor"]
    saved = load_file(str(tmp_path / tensor["capture"]["file"]))[tensor["capture"]["tensor"]]
    assert saved.view(np.uint32).reshape(-1).tolist() == [0x3F800000, 0x7FC00000, 0x7FC00000, 0x7FC00000,
                                                          0x80000000, 0x7F800000]
    assert model_trace.fingerprint(saved) == tensor["fingerprint"] == CANONICAL
    assert values.view(np.uint32).reshape(-1).tolist() == VECTOR.tolist(), "the model's tensor is left as it was"
