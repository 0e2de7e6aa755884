"""The trace writer assembles its lines from templates and number texts made in bulk: each line
must be the JSON that the Rust writer writes for the same event (keys in order, no spaces, floats
as serde_json writes float32 values, non-finite values as strings), and the top tokens of a
logits row those of a stable sort."""

import json

import numpy as np
import pytest

from model_trace.format import f32_text
from model_trace.writer import TraceWriter, top_tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import model_trace.torch  # noqa: E402  (after the skips: it needs torch)


def test_top_tokens_are_those_of_a_stable_sort():
    rng = np.random.default_rng(3)
    for trial in range(2000):
        n = int(rng.integers(1, 60))
        row = rng.integers(-3, 3, n).astype(np.float32)  # many ties
        for value, every in ((np.nan, 3), (np.inf, 5), (-np.inf, 7)):
            if trial % every == 0:
                row[rng.integers(0, n, 2)] = value
        count = int(rng.integers(0, 8))
        finite = np.where(np.isfinite(row), row, -np.inf)
        expected = [int(i) for i in np.argsort(-finite, kind="stable")[:count] if np.isfinite(row[i])]
        assert top_tokens(row, count).tolist() == expected, (row, count)


def broken_llama():
    """A small random Llama whose second block's MLP puts NaN, ±inf, ±0 and 1e30 into its
    output, and whose third block's attention has NaN, inf, 0 and a subnormal weight."""
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()

    def poison(_module, _args, output):
        output = output.clone()
        output[0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
        output[0, 1, :2] = torch.tensor([0.0, -0.0])
        output[0, -1, :] = 1e30
        return output

    def poison_attention(_module, _args, output):
        probs = output[1].clone()
        probs[0, 0, -1, :2] = torch.tensor([float("nan"), float("inf")])
        probs[0, 1, -1, 0] = 0.0
        probs[-1, 1, 0, 0] = 1e-39
        return (output[0], probs) + tuple(output[2:])

    model.model.layers[1].mlp.register_forward_hook(poison)
    model.model.layers[2].self_attn.register_forward_hook(poison_attention)
    return model


def rust_dumps(value):
    """The JSON text of a parsed event as the Rust writer writes it, one value at a time."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(key)}:{rust_dumps(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(rust_dumps(item) for item in value) + "]"
    if isinstance(value, float):
        return f32_text(value)
    if isinstance(value, str) and value in ("NaN", "inf", "-inf"):
        return f32_text(float(value))
    return json.dumps(value, separators=(",", ":"))


def test_every_line_is_what_the_rust_writer_writes(tmp_path):
    path = tmp_path / "t.ndjson"
    model = broken_llama()
    with torch.no_grad(), model_trace.torch.trace(model, str(path), capture="layer:*,pass=0"):
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
        model(input_ids=torch.tensor([[1, 2], [3, 4]]))
    lines = path.read_text().splitlines()
    assert len(lines) > 10
    for line in lines[1:]:  # the header holds no float32 values
        assert rust_dumps(json.loads(line)) == line


def test_summaries_made_elsewhere_are_written_as_given(tmp_path):
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(str(path))
    writer.begin_pass(0)
    writer.begin_layer(0, "layer", "layer.0")
    summary = {"shape": [2], "dtype": "f32", "stats": {"count": 2, "min": -0.5, "max": 1e-05, "mean": "NaN"}}
    writer.stage_summary("attn_out", summary)
    writer.stage("output", np.array([1.5, -0.0], dtype=np.float32))
    writer.end_layer()
    writer.close()
    layer = next(e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "layer")
    assert layer["stages"][0]["tensor"] == summary
    assert layer["stages"][1]["tensor"]["head"] == [1.5, -0.0]


def test_attention_rows_of_a_batch_are_written_as_analysed_one_tensor_at_a_time(tmp_path):
    """The writer analyses and writes the rows of a batch's attention tensors together (those
    with one number of keys in one analysis, all of them in one layout): each event's rows are
    what the analysis of its tensor alone gives."""
    from model_trace.attention import attention_rows

    rng = np.random.default_rng(8)
    shapes = [(2, 3, 4, 4), (1, 2, 1, 7), (3, 5), (1, 1, 2, 4), (9,), (1, 2, 3, 4)]
    tensors = []
    for shape in shapes:
        probs = rng.dirichlet(np.ones(shape[-1]) * 0.3, size=shape[:-1]).astype(np.float32).reshape(shape)
        tensors.append(probs)
    tensors[0][1, 2, 3] = 0.0  # a row that keeps nothing
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(str(path))
    writer.begin_pass(0)
    for layer, probs in enumerate(tensors):
        writer.attention(probs, layer, "attn", "attn", top_k=3 if layer == 4 else 10, weight_threshold=0.05)
    writer.end_pass()
    writer.close()
    lines = path.read_text().splitlines()
    assert all(rust_dumps(json.loads(line)) == line for line in lines[1:])
    events = [json.loads(line) for line in lines]
    written = [e for e in events if e.get("event") == "attention"]
    assert len(written) == len(tensors)
    for layer, (probs, event) in enumerate(zip(tensors, written)):
        expected = list(attention_rows(probs, 3 if layer == 4 else 10, 0.05).records(layer))
        assert event["rows"] == json.loads(json.dumps(expected)), layer
    assert written[0]["rows"][-1]["top_k_positions"] == [] and written[0]["rows"][-1]["top_k_weights"] == []


class Clock:
    """Counts the waits of the pending values below."""

    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1


class FakeCopy:
    """Stands for values being copied from a device: read only after a wait that came after it."""

    def __new__(cls, values, clock):
        from model_trace.writer import Pending

        class Copy(Pending):
            __slots__ = ("source", "made_at")

            def read(self):
                assert clock.waits > self.made_at, "pending values read before a wait"
                return self.source

        copy = Copy(np.shape(values), clock.wait)
        copy.source, copy.made_at = np.array(values), clock.waits
        return copy


def record(path, wrap, flush_floats=None):
    """A pass of stages, attention (two numbers of keys) and logits, and a pass of a stage,
    each tensor given through ``wrap``; ``flush_floats``: the writer's PENDING_FLOATS."""
    rng = np.random.default_rng(5)
    writer = TraceWriter(str(path), capture="*")
    if flush_floats is not None:
        writer.PENDING_FLOATS = flush_floats
    writer.begin_pass(wrap(np.array(4, dtype=np.int64)), tokens=wrap(np.array([[1, 9152], [28, 0]], dtype=np.int64)))
    for layer in range(3):
        writer.begin_layer(layer, "layer", f"layers.{layer}")
        writer.stage("input", wrap(rng.standard_normal((1, 3, 8)).astype(np.float32)), wants_capture=layer == 1)
        probs = rng.dirichlet(np.ones(4 + layer % 2), size=(1, 2, 3)).astype(np.float32)
        writer.attention(wrap(probs), layer, "attn", f"layers.{layer}.attn", wants_capture=layer == 2)
        writer.stage("attn_out", wrap(rng.standard_normal((1, 3, 8)).astype(np.float32)))
        writer.end_layer()
    writer.logits(wrap(rng.standard_normal((2, 11)).astype(np.float32)), 3, "lm_head", "lm_head", wants_capture=True)
    writer.end_pass()
    writer.begin_pass(7)
    writer.begin_layer(0, "layer", "layers.0")
    writer.stage("output", wrap(np.array([[1.5, np.nan, -np.inf]], dtype=np.float32)), dtype="bf16")
    writer.end_layer()
    writer.close()
    return [{k: v for k, v in e.items() if not k.endswith("_ns")} for e in map(json.loads, path.read_text().splitlines()[1:])]


@pytest.mark.parametrize("flush_floats", [None, 40])
def test_pending_values_are_read_after_one_wait_a_batch_and_written_as_the_values(tmp_path, flush_floats):
    """Values still being copied (:class:`model_trace.writer.Pending`) are read only after a wait,
    one a batch however many tensors it holds, and give the trace that the values give; also
    when the writer writes a batch within a pass (``flush_floats``)."""
    (tmp_path / "arrays").mkdir()
    (tmp_path / "pending").mkdir()
    expected = record(tmp_path / "arrays" / "t.ndjson", lambda values: values, flush_floats)
    clock = Clock()
    written = record(tmp_path / "pending" / "t.ndjson", lambda values: FakeCopy(values, clock), flush_floats)
    assert written == expected
    assert expected[0]["position"] == 4 and expected[0]["event"] == "pass_begin"
    assert expected[0]["tokens"] == [1, 9152, 28, 0]
    # One a pass (its batch); written within the passes, one for each batch that holds some.
    assert clock.waits == 2 if flush_floats is None else 2 < clock.waits < 11
    summaries = [s["tensor"] for e in expected for s in e.get("stages", [])]
    summaries += [e[key] for e in expected for key in ("probs", "logits") if key in e]
    captured = sorted(summary["capture"]["tensor"] for summary in summaries if "capture" in summary)
    from safetensors.numpy import load_file

    arrays, pending = (load_file(str(tmp_path / folder / "t.tensors-0000.safetensors")) for folder in ("arrays", "pending"))
    assert len(captured) == 3 and sorted(arrays) == sorted(pending) == captured
    assert all(arrays[name].tobytes() == pending[name].tobytes() for name in arrays)


def test_a_batch_written_within_a_pass_keeps_the_open_layers_stages(tmp_path):
    """A batch written before a layer ends (the pass's numbers past PENDING_FLOATS at an
    attention event) leaves that layer's stages to the next batch with their own numbers."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert record(tmp_path / "a" / "t.ndjson", lambda values: values, 40) == record(tmp_path / "b" / "t.ndjson", lambda values: values)


def test_a_pass_s_tokens_are_written_last_when_given_and_absent_otherwise(tmp_path):
    """``pass_begin.tokens`` as the Rust writer writes it: the last key, integers; no key when the
    pass was given none. The reader keeps it."""
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(str(path))
    writer.begin_pass(0, tokens=[1, 9152, 28])
    writer.begin_pass(3, tokens=np.array([42], dtype=np.int32))
    writer.begin_pass(4, tokens=[])
    writer.begin_pass(5)
    writer.close()
    lines = [line for line in path.read_text().splitlines() if '"pass_begin"' in line]
    assert lines[0].endswith(',"tokens":[1,9152,28]}')
    assert rust_dumps(json.loads(lines[0])) == lines[0]
    assert '"tokens"' not in lines[3]
    _, events = model_trace.read_trace(str(path))
    begins = [e for e in events if e["event"] == "pass_begin"]
    assert [b.get("tokens") for b in begins] == [[1, 9152, 28], [42], [], None]


@pytest.mark.parametrize("tokens", [[-1], [1 << 32], [3, -100]])
def test_token_ids_outside_u32_are_refused(tmp_path, tokens):
    writer = TraceWriter(str(tmp_path / "t.ndjson"))
    with pytest.raises(ValueError, match="token ids"):
        writer.begin_pass(0, tokens=tokens)
    writer.close()
