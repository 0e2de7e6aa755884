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
