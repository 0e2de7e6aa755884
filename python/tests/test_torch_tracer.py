"""The PyTorch tracer on a small random Llama (no weights to fetch): what its tracepoints are
called, and which tensors a capture filter saves."""

import pytest

import model_trace

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import model_trace.torch  # noqa: E402  (after the skips: it needs torch)


@pytest.fixture(scope="module")
def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def traced(model, path, capture=None):
    with torch.no_grad(), model_trace.torch.trace(model, str(path), capture=capture):
        model(input_ids=torch.tensor([[1, 2, 3]]))
    return model_trace.read_trace(str(path))


def captured(events):
    names = []
    for event in events:
        summaries = [stage["tensor"] for stage in event.get("stages", [])]
        summaries += [event[key] for key in ("probs", "logits") if key in event]
        names += [summary["capture"]["tensor"] for summary in summaries if "capture" in summary]
    return sorted(names)


def test_attention_events_name_the_attention_module(tiny_llama, tmp_path):
    _, events = traced(tiny_llama, tmp_path / "t.ndjson")
    attention = [(e["tracepoint"], e["function"]) for e in events if e["event"] == "attention"]
    assert attention == [("self_attn", f"model.layers.{i}.self_attn") for i in range(3)]


@pytest.mark.parametrize("capture, expected", [
    ("attention:self_attn", ["p0.l0.attention.s5", "p0.l1.attention.s14", "p0.l2.attention.s23"]),
    ("layer:*,pass=0,layer=1", ["p0.l1.input.s12", "p0.l1.output.s19"]),
    ("logits:lm_head", ["p0.l3.logits.s29"]),
    # `::` globs see LlamaForCausalLM::<the module's path>
    ("LlamaForCausalLM::model.layers.2.*,-attention:*", ["p0.l2.attn_in.s22", "p0.l2.attn_out.s24", "p0.l2.mlp_in.s26",
                                                          "p0.l2.mlp_out.s27", "p0.l2.resid_mid.s25"]),
    ("tensor:mlp_*,-*::model.layers.0.*,layer=..2", ["p0.l1.mlp_in.s17", "p0.l1.mlp_out.s18"]),
    # a torch module has no file: `@file` selects nothing
    ("*@modeling_llama.py", []),
])
def test_captures_follow_the_filter(tiny_llama, tmp_path, capture, expected):
    _, events = traced(tiny_llama, tmp_path / "t.ndjson", capture=capture)
    assert captured(events) == expected


def test_attention_is_analysed_on_its_device_only_when_large():
    from types import SimpleNamespace

    def probs(device, elements):
        return SimpleNamespace(device=SimpleNamespace(type=device), numel=lambda: elements)

    threshold = model_trace.torch.DEVICE_ANALYSIS_MIN_ELEMENTS
    assert not model_trace.torch.analysed_on_device(probs("cpu", 10 * threshold))
    assert not model_trace.torch.analysed_on_device(probs("cuda", 1 * 9 * 1 * 17))  # a decode step's
    assert not model_trace.torch.analysed_on_device(probs("cuda", 1 * 9 * 16 * 16))  # a 16-token prefill's
    assert not model_trace.torch.analysed_on_device(probs("cuda", threshold - 1))
    assert model_trace.torch.analysed_on_device(probs("cuda", threshold))
    assert model_trace.torch.analysed_on_device(probs("mps", 1 * 9 * 512 * 512))


class CopyClock:
    """Stands for the device: counts its synchronisations, and checks that every copy's values
    are read after one that came after the copy began."""

    def __init__(self):
        self.waits = 0
        self.begun = {}

    def wait(self):
        self.waits += 1


@pytest.fixture
def copies_of_cpu_tensors(monkeypatch):
    """CPU tensors copied as CUDA ones are (model_trace.torch.host.HostCopy), the device's
    synchronisation counted instead."""
    clock = CopyClock()
    host_copy = model_trace.torch.host.HostCopy
    begin, read = host_copy.__init__, host_copy.read

    def begun(self, tensor):
        begin(self, tensor)
        clock.begun[id(self)] = clock.waits

    def checked_read(self):
        assert clock.waits > clock.begun.pop(id(self)), "a copy read before the device was synchronised"
        return read(self)

    monkeypatch.setattr(model_trace.torch.host, "ASYNC_COPY_DEVICES", ("cpu",))
    monkeypatch.setattr(model_trace.torch.host, "_synchronizer", lambda device: clock.wait)
    monkeypatch.setattr(host_copy, "__init__", begun)
    monkeypatch.setattr(host_copy, "read", checked_read)
    return clock


def timeless(events):
    return [{k: v for k, v in e.items() if not k.endswith("_ns")} for e in events]


def two_passes(model, path, capture="*"):
    with torch.no_grad(), model_trace.torch.trace(model, str(path), capture=capture):
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
        model(input_ids=torch.tensor([[5, 6], [7, 8]]))
    return timeless(model_trace.read_trace(str(path))[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_asynchronous_copies_give_the_trace_of_blocking_ones(tiny_llama, tmp_path, copies_of_cpu_tensors, monkeypatch,
                                                              dtype):
    """The path of a CUDA tensor (copied without waiting, read after one synchronisation a
    pass; a bfloat16 one copied as it is and widened in host memory), taken here by CPU
    tensors: the same trace and captures as the CPU path's."""
    model = tiny_llama.to(dtype)
    try:
        (tmp_path / "async").mkdir()
        (tmp_path / "blocking").mkdir()
        written = two_passes(model, tmp_path / "async" / "t.ndjson")
        assert copies_of_cpu_tensors.waits == 2 and not copies_of_cpu_tensors.begun
        monkeypatch.setattr(model_trace.torch.host, "ASYNC_COPY_DEVICES", ("cuda",))
        assert written == two_passes(model, tmp_path / "blocking" / "t.ndjson")
    finally:
        tiny_llama.to(torch.float32)
    assert any(e["event"] == "logits" for e in written) and sum(e["event"] == "attention" for e in written) == 6
    from safetensors.numpy import load_file

    captured = [load_file(str(tmp_path / folder / "t.tensors-0000.safetensors")) for folder in ("async", "blocking")]
    assert captured[0].keys() == captured[1].keys() and len(captured[0]) > 20
    assert all(captured[0][name].tobytes() == captured[1][name].tobytes() for name in captured[0])


def pass_tokens(events):
    return [e.get("tokens") for e in events if e["event"] == "pass_begin"]


def test_each_pass_records_the_input_ids_it_consumed(tiny_llama, tmp_path):
    """By keyword or as the first positional argument, a batch's rows one after another; a
    pass given embeddings has none."""
    path = tmp_path / "t.ndjson"
    with torch.no_grad(), model_trace.torch.trace(tiny_llama, str(path)):
        tiny_llama(input_ids=torch.tensor([[1, 2, 3]]))
        tiny_llama(torch.tensor([[4, 5], [6, 7]]))
        tiny_llama(inputs_embeds=tiny_llama.get_input_embeddings()(torch.tensor([[8]])))
    assert pass_tokens(model_trace.read_trace(str(path))[1]) == [[1, 2, 3], [4, 5, 6, 7], None]


def test_a_generation_s_passes_record_the_prompt_then_each_new_token(tiny_llama, tmp_path):
    path = tmp_path / "t.ndjson"
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad(), model_trace.torch.trace(tiny_llama, str(path)):
        generated = tiny_llama.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    ids = generated[0].tolist()
    assert pass_tokens(model_trace.read_trace(str(path))[1]) == [ids[:3], [ids[3]], [ids[4]]]


def test_device_input_ids_are_copied_like_the_tensors(tiny_llama, copies_of_cpu_tensors, tmp_path):
    """A CUDA tensor's ids (here a CPU tensor taken down that path) are read after the pass's
    one synchronisation, not when the pass begins."""
    path = tmp_path / "t.ndjson"
    with torch.no_grad(), model_trace.torch.trace(tiny_llama, str(path)):
        tiny_llama(input_ids=torch.tensor([[1, 9, 3]]))
    assert copies_of_cpu_tensors.waits == 1 and not copies_of_cpu_tensors.begun
    assert pass_tokens(model_trace.read_trace(str(path))[1]) == [[1, 9, 3]]


def test_a_device_cache_position_is_copied_like_the_tensors(copies_of_cpu_tensors, tmp_path):
    position = model_trace.torch.tracing.pass_position((), {"cache_position": torch.tensor([7, 8, 9])})
    assert isinstance(position, model_trace.torch.host.HostCopy)
    writer = model_trace.writer.TraceWriter(str(tmp_path / "t.ndjson"))
    writer.begin_pass(position)
    writer.close()
    assert model_trace.read_trace(str(tmp_path / "t.ndjson"))[1][0]["position"] == 7
    assert copies_of_cpu_tensors.waits == 1


def test_attention_rows_are_the_same_analysed_on_the_device_or_with_the_batch(tiny_llama, tmp_path, monkeypatch):
    """Rows analysed by torch on the tensor's device (here the CPU's) and rows analysed with the
    batch in host memory, in numpy: the same trace."""
    from model_trace.attention import _analyse, _Torch

    with_batch = two_passes(tiny_llama, tmp_path / "batch.ndjson", capture=None)
    monkeypatch.setattr(model_trace.torch.host, "analysed_on_device", lambda probs: True)
    monkeypatch.setattr(model_trace.torch.host, "attention_rows",
                        lambda probs: _analyse(probs.detach().to(torch.float32), 10, 0.01, _Torch(torch, probs.device)))
    assert two_passes(tiny_llama, tmp_path / "device.ndjson", capture=None) == with_batch


def layer_stats(events, stage):
    return {e["layer"]: next(s["tensor"]["stats"] for s in e["stages"] if s["name"] == stage)
            for e in events if e["event"] == "layer"}


def test_isolate_feeds_each_layer_the_other_runs_captured_input(tiny_llama, tmp_path):
    """The reference fed the port's layer inputs: each layer's input here is the port's, its
    output what this model computes from it; a run fed its own captures reproduces itself."""
    port_path = tmp_path / "port.ndjson"
    config = tiny_llama.config
    torch.manual_seed(1)
    port = transformers.LlamaForCausalLM(config).eval()  # other weights: another model's inputs
    _, port_events = traced(port, port_path, capture="layer:*")
    own_path = tmp_path / "own.ndjson"
    _, own_events = traced(tiny_llama, own_path, capture="layer:*")

    isolated = tmp_path / "isolated.ndjson"
    with torch.no_grad(), model_trace.torch.trace(tiny_llama, str(isolated), isolate=str(port_path)):
        tiny_llama(input_ids=torch.tensor([[1, 2, 3]]))
    header, events = model_trace.read_trace(str(isolated))
    assert header["isolate"] == str(port_path)
    assert header["interventions"] == [f"stage=input replace({port_path})"]
    assert layer_stats(events, "input") == layer_stats(port_events, "input")
    assert layer_stats(events, "output") != layer_stats(port_events, "output")
    changes = [e for e in events if e["event"] == "intervention"]
    assert [(c["layer"], c["stage"]) for c in changes] == [(0, "input"), (1, "input"), (2, "input")]
    assert changes[1]["source"] == f"{port_path} p0.l1.input"
    # Each intervention event comes before its layer's event.
    order = [(e["event"], e.get("layer")) for e in events if e["event"] in ("intervention", "layer")]
    assert order.index(("intervention", 0)) < order.index(("layer", 0))

    again = tmp_path / "again.ndjson"
    with torch.no_grad(), model_trace.torch.trace(tiny_llama, str(again), isolate=str(own_path)):
        tiny_llama(input_ids=torch.tensor([[1, 2, 3]]))
    _, again_events = model_trace.read_trace(str(again))
    assert layer_stats(again_events, "output") == layer_stats(own_events, "output")
    assert all(e["delta_l2"] == 0.0 for e in again_events if e["event"] == "intervention")


def test_isolate_needs_captures(tiny_llama, tmp_path):
    plain = tmp_path / "plain.ndjson"
    traced(tiny_llama, plain)
    with pytest.raises(ValueError, match="MODEL_TRACE_CAPTURE=layer:"):
        with model_trace.torch.trace(tiny_llama, str(tmp_path / "x.ndjson"), isolate=str(plain)):
            pass
