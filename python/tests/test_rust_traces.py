"""Trace files written by the Rust examples, read from Python: the captured tensors load with
the `safetensors` package and carry exactly the fingerprint, sketch and samples the trace
recorded; the statistics agree with numpy's; DuckDB and polars read the file as it is."""

import json
import math
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file

import model_trace
import model_trace.floats
from model_trace.format import f32_text, iter_stages, read_float

from conftest import run_example


@pytest.fixture(scope="module")
def minilm_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm") / "minilm.ndjson"
    run_example("minilm", ["--trace-out", str(out), "--capture", "*", "This is an example sentence"], cwd=out.parent)
    return out


def captured(trace_path):
    """Every (place, summary, values) of a trace whose tensor was captured."""
    header, events = model_trace.read_trace(str(trace_path))
    files = {}
    found = []
    for event in events:
        summaries = []
        if event["event"] == "layer":
            summaries = [(f"pass {event['pass']} layer {event['layer']} {s['name']}", s["tensor"]) for s in event["stages"]]
        elif event["event"] == "attention":
            summaries = [(f"attention layer {event['layer']}", event["probs"])]
        elif event["event"] == "logits":
            summaries = [(f"logits layer {event['layer']}", event["logits"])]
        for place, summary in summaries:
            capture = summary.get("capture")
            if not capture:
                continue
            if capture["file"] not in files:
                files[capture["file"]] = load_file(str(trace_path.parent / capture["file"]))
            found.append((place, summary, files[capture["file"]][capture["tensor"]]))
    return found


def bits(values):
    return [struct.unpack("<I", struct.pack("<f", v))[0] if not math.isnan(v) else "nan" for v in values]


@pytest.mark.parametrize("trace", ["smollm_trace", "minilm_trace"])
def test_captured_tensors_carry_the_recorded_digest(trace, request):
    path = request.getfixturevalue(trace)
    found = captured(path)
    assert len(found) >= 10, f"only {len(found)} captured tensors"
    kinds = {place.split()[0] for place, _, _ in found}
    assert {"pass", "attention"} <= kinds, kinds
    for place, summary, values in found:
        assert values.dtype == np.float32, place
        assert list(values.shape) == summary["shape"], place
        # exact: the same bits
        assert model_trace.fingerprint(values) == summary["fingerprint"], place
        assert bits(model_trace.sketch(values)) == bits([read_float(v) for v in summary["sketch"]]), place
        flat = values.reshape(-1)
        assert bits(flat[:4]) == bits([read_float(v) for v in summary["head"]]), place
        assert bits(flat[-4:]) == bits([read_float(v) for v in summary["tail"]]), place


@pytest.mark.parametrize("trace", ["smollm_trace", "minilm_trace"])
def test_statistics_agree_with_numpy(trace, request):
    """Counts, min and max are exact; mean, std and L2 norm are summed in a different order by
    the Rust kernels (blocks of f32 folded into f64) than by numpy (f64 pairwise), so they agree
    to the rounding of the f32 result: 2 ulps of float32 (relative 2.4e-7), measured here."""
    path = request.getfixturevalue(trace)
    worst = 0.0
    for place, summary, values in captured(path):
        ours = summary["stats"]
        numpy_stats = model_trace.stats(values)
        for key in ("count", "nan_count", "inf_count"):
            assert ours[key] == numpy_stats[key], (place, key)
        for key in ("min", "max"):
            assert read_float(ours[key]) == read_float(numpy_stats[key]), (place, key)
        scale = max(abs(read_float(numpy_stats["mean"])), read_float(numpy_stats["std"]), 1e-30)
        for key, reference in (("mean", scale), ("std", read_float(numpy_stats["std"])), ("l2_norm", read_float(numpy_stats["l2_norm"]))):
            error = abs(read_float(ours[key]) - read_float(numpy_stats[key])) / max(reference, 1e-30)
            worst = max(worst, error)
            assert error <= 2.5e-7, (place, key, ours[key], numpy_stats[key])
    print(f"worst relative difference of mean/std/l2 from numpy: {worst:.2e}")


@pytest.mark.parametrize("trace", ["smollm_trace", "minilm_trace"])
@pytest.mark.parametrize("formatter", ["orjson", "arithmetic"])
def test_floats_are_written_as_the_rust_writer_writes_them(trace, formatter, request, monkeypatch):
    """Every float of a Rust trace, written by the Python writer's formatter from its float32
    value, is the same text, byte for byte."""
    if formatter == "orjson" and model_trace.floats._orjson is None:
        pytest.skip("orjson is not installed, or writes floats another way")
    if formatter == "arithmetic":
        monkeypatch.setattr(model_trace.floats, "_orjson", None)
    texts = []
    for line in request.getfixturevalue(trace).read_text().splitlines():
        json.loads(line, parse_float=texts.append)
    assert len(texts) > 1000
    ours = model_trace.floats.float_texts(np.array([float(t) for t in texts], dtype=np.float32))
    assert [ours[i] for i in range(len(ours))] == texts
    assert [f32_text(float(t)) for t in texts[:2000]] == texts[:2000]


def test_duckdb_and_polars_read_the_file_as_it_is(smollm_trace):
    import duckdb
    import polars as pl

    _, events = model_trace.read_trace(str(smollm_trace))
    layers = sum(1 for e in events if e["event"] == "layer")
    connection = duckdb.connect()
    counted = connection.execute(
        f"select count(*) from read_ndjson('{smollm_trace}', maximum_object_size=67108864) where event = 'layer'"
    ).fetchone()[0]
    assert counted == layers
    mean = connection.execute(
        f"select max(s.tensor.stats.mean) from (select unnest(stages) as s from read_ndjson('{smollm_trace}', "
        "maximum_object_size=67108864) where event = 'layer')"
    ).fetchone()[0]
    assert mean is not None
    frame = pl.read_ndjson(smollm_trace, infer_schema_length=None)
    assert frame.filter(pl.col("event") == "layer").height == layers

    # A broken run writes "NaN" where numbers stand elsewhere: both still read the file.
    lines = smollm_trace.read_text().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith('{"event":"layer"'))
    event = __import__("json").loads(lines[at])
    event["stages"][1]["tensor"]["head"][1] = "NaN"
    event["stages"][1]["tensor"]["stats"]["mean"] = "NaN"
    lines[at] = model_trace.format.dumps(event)
    broken = smollm_trace.with_name("broken.ndjson")
    broken.write_text("\n".join(lines))
    assert pl.read_ndjson(broken, infer_schema_length=None).height == len(events) + 1
    assert connection.execute(f"select count(*) from read_ndjson('{broken}', maximum_object_size=67108864)").fetchone()[0] == len(events) + 1


def test_the_sketch_definition_matches_the_pinned_vector():
    """The test vector of docs/trace-format.md, pinned in the Rust tests too."""
    hashes = model_trace.format.element_hashes(4)
    assert [int(h) for h in hashes] == [0x98CF04E2063FD812, 0x3414C8F48E32B692, 0x4C7EB505CFEB18F0, 0x566C9DA8593BEAC1]
    data = np.array([0.5, -1.25, 3.0, 2.0**-20, -7.75, 1e-3, 100.0], dtype=np.float32)
    expected = [0xC2D2FF7D, 0xC2B10083, 0xC2B40083, 0x42DC0083, 0x42D30083, 0x42D00083, 0xC2DF0083, 0xC2DA0083]
    assert [int(b) for b in model_trace.sketch(data).view(np.uint32)] == expected
    # non-finite values count as nothing
    broken = data.copy()
    broken[1] = np.nan
    zeroed = data.copy()
    zeroed[1] = 0
    assert (model_trace.sketch(broken) == model_trace.sketch(zeroed)).all()


def test_floats_are_written_losslessly():
    from model_trace.format import dumps, f32

    for value in [0.1, 1e-45, 3.4028235e38, -0.0, 1.0000001, np.nan, np.inf, -np.inf]:
        text = dumps({"v": f32(value)})
        back = read_float(__import__("json").loads(text)["v"])
        expected = np.float32(value)
        if np.isnan(expected):
            assert math.isnan(back)
        else:
            assert np.float32(back).view(np.uint32) == expected.view(np.uint32), (value, text)


def test_attention_rows_agree_with_the_rust_runtime(minilm_trace):
    """The Python writer's attention rows from the same probabilities as the Rust runtime's: the
    kept positions and weights bit for bit; the entropy to 2e-6 relative (the runtime uses a
    branch-free logarithm within ~1 ulp of f32, torch the libm one) and the tail mass to 1e-6
    (f64 sums in another order)."""
    from model_trace.attention import attention_rows

    header, events = model_trace.read_trace(str(minilm_trace))
    top_k = header["config"]["attention_config"]["top_k"]
    threshold = header["config"]["attention_config"]["weight_threshold"]
    checked = 0
    for event in events:
        if event["event"] != "attention" or "capture" not in event["probs"]:
            continue
        capture = event["probs"]["capture"]
        probs = load_file(str(minilm_trace.parent / capture["file"]))[capture["tensor"]]
        ours = {(r["batch"], r["head_idx"], r["query_pos"]): r
                for r in attention_rows(probs, top_k, threshold).records(event["layer"])}
        for row in event["rows"]:
            mine = ours[row["batch"], row["head_idx"], row["query_pos"]]
            assert (mine["layer_idx"], mine["num_keys"]) == (row["layer_idx"], row["num_keys"])
            assert mine["top_k_positions"] == row["top_k_positions"], (event["layer"], row)
            assert bits([read_float(v) for v in mine["top_k_weights"]]) == bits([read_float(v) for v in row["top_k_weights"]])
            assert read_float(mine["sink_weight"]) == read_float(row["sink_weight"])
            assert abs(read_float(mine["entropy"]) - read_float(row["entropy"])) <= 2e-6 * max(read_float(row["entropy"]), 1e-3)
            assert abs(read_float(mine["tail_mass"]) - read_float(row["tail_mass"])) <= 1e-6
            checked += 1
    assert checked == 6 * 12 * 7, checked
