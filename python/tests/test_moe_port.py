"""Our mixture-of-experts port (``examples/moe``, candle) against transformers on the two small
random models of ``moe_models.py``, router by router: the clean port chooses the reference's
experts on every token whose reference margin is above the port's router-logit error (every
difference a ``near-tie``), each routing bug of ``moe::bugs``, injected in one layer, is named
by ``model-trace diff`` at that layer as a routing or a weighting difference, or (a router in
bf16) by its own router logits, whose flips are near-ties; no layer after the bug's is named for
its router logits or its experts' computation (they inherit). Three ways: llama.cpp traced on
the same passes routes every token as transformers does, and with it as ``--floor`` the clean
port is flagged nowhere while the bugs still are.

Both sides run the same passes over ``IDS``: a prefill of all but the last ``DECODE`` ids, then
one decode step through the KV cache for each of those (given, not generated, so that a port
that predicts other tokens still runs the reference's passes). Two bugs need a model where they
show, made from the case's files: ``softmax-after-topk`` and ``renormalize`` one without
``norm_topk_prob`` (with it, the softmax of the k chosen logits *is* the renormalised top-k of
the softmax, and renormalising what is renormalised changes nothing); ``mask-zero`` one whose
selection biases are all shifted by -1 (a shift that changes no choice of the reference), where
a chosen group's selection scores are negative and a masked expert's 0 beats them (with
DeepSeek-V3's positive scores, 0 and ``-inf`` mask alike).

Cost (measured on 2 shared cores, the models cached, ``pytest --durations``): the whole file
8-9 s, of which the five transformers traces of the fixture 5-7 s, each three-way test 0.2 s
(llama.cpp's four passes and three diffs) and each other test under 0.1 s (a port run of
milliseconds and a diff); the binaries are the suite's test build's.
"""

import json
import shutil

import pytest

import model_trace
import moe_models
from conftest import run_example
from test_reference_diff import diff

torch = pytest.importorskip("torch")

#: The token ids both sides run, all below the models' vocabulary of 256 (the port's default).
IDS = (1, 17, 42, 99, 3, 250, 7, 128, 64, 5, 200, 33)
#: The last ids, each run in a decode step of its own.
DECODE = 3
#: The layer each bug is injected in: a mixture of experts in both models (DeepSeek-V3's layer 0
#: is dense), before ``moe_models.NEAR_TIE_LAYER``.
LAYER = 1

#: The models the bugs run on: a case of ``moe_models``, and the change that makes a bug show.
VARIANTS = {
    "qwen3_moe": ("qwen3_moe", {}, 0.0),
    "qwen3_moe-no-norm": ("qwen3_moe", {"norm_topk_prob": False}, 0.0),
    "deepseek_v3": ("deepseek_v3", {}, 0.0),
    "deepseek_v3-no-norm": ("deepseek_v3", {"norm_topk_prob": False}, 0.0),
    "deepseek_v3-negative": ("deepseek_v3", {}, -1.0),
}

#: Each bug with the model it shows on and the layer verdict of ``diff`` at ``LAYER``: ``routing``
#: (a token chose other experts by more than the port's logit error), ``weights`` (the same
#: experts, weights past that error) or ``router_logits`` (the router's logits beyond the stages'
#: tolerance, rtol 1e-4, from an input within it: its own computation).
BUGS = [
    ("softmax-after-topk", "qwen3_moe-no-norm", "weights"),
    ("renormalize", "qwen3_moe-no-norm", "weights"),
    ("renormalize", "deepseek_v3-no-norm", "weights"),
    ("no-renormalize", "qwen3_moe", "weights"),
    ("no-renormalize", "deepseek_v3", "weights"),
    ("bias-in-weights", "deepseek_v3", "weights"),
    ("mask-zero", "deepseek_v3-negative", "routing"),
    ("scale-twice", "deepseek_v3", "weights"),
    ("softmax-for-sigmoid", "deepseek_v3", "routing"),
    ("experts-off-by-one", "qwen3_moe", "routing"),
    ("experts-off-by-one", "deepseek_v3", "routing"),
    ("router-bf16", "qwen3_moe", "router_logits"),
    ("router-bf16", "deepseek_v3", "router_logits"),
]

#: Layer verdicts that say the routing agrees (within the port's error).
AGREE = ("same", "near_ties")


def make_variant(directory, source, config_changes, bias_shift):
    """A copy of the model in ``source`` with ``config_changes`` in its config.json and every
    ``e_score_correction_bias`` shifted by ``bias_shift``."""
    from safetensors.torch import load_file, save_file

    directory.mkdir()
    config = json.loads((source / "config.json").read_text())
    config.update(config_changes)
    (directory / "config.json").write_text(json.dumps(config))
    if not bias_shift:
        shutil.copy(source / "model.safetensors", directory / "model.safetensors")
        return directory
    tensors = load_file(str(source / "model.safetensors"))
    for name in tensors:
        if name.endswith("e_score_correction_bias"):
            tensors[name] = tensors[name] + bias_shift
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def trace_transformers(model_dir, out):
    """transformers' passes over ``IDS`` (the prefill, then the decode steps), traced."""
    from transformers import AutoModelForCausalLM

    import model_trace.torch

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad(), model_trace.torch.trace(model, str(out)):
        output = model(input_ids=torch.tensor([IDS[:-DECODE]]), use_cache=True)
        for token in IDS[-DECODE:]:
            output = model(input_ids=torch.tensor([[token]]), past_key_values=output.past_key_values,
                           use_cache=True)
    return out


def trace_port(directory, model_dir, name, bug=None, at=LAYER):
    """The port's passes over ``IDS``, traced, with ``bug`` injected in layer ``at`` (``None``:
    in every layer)."""
    out = directory / f"{name}.ndjson"
    args = ["--model", str(model_dir), "--tokens", ",".join(map(str, IDS)), "--decode-steps", str(DECODE),
            "--trace-out", str(out)]
    if bug:
        args = ["--inject-bug", bug if at is None else f"{bug}@{at}", *args]
    run_example("moe", args, cwd=directory)
    return out


def trace_llama_cpp(model_dir, out):
    """llama.cpp's passes over ``IDS`` (the GGUF of ``moe_models``, F32, and an F32 KV cache):
    the prefill, then the decode steps, as the other two sides run them."""
    from model_trace import llama_cpp

    passes = [list(IDS[:-DECODE]), *([token] for token in IDS[-DECODE:])]
    llama_cpp.run(str(moe_models.gguf(model_dir)), passes, str(out), kv="f32")
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each variant's model directory and transformers' trace on it, made once."""
    directory = tmp_path_factory.mktemp("moe-port")
    cases = moe_models.cached()
    made = {}
    for name, (case, config_changes, bias_shift) in VARIANTS.items():
        model_dir = cases[case]
        if config_changes or bias_shift:
            model_dir = make_variant(directory / name, cases[case], config_changes, bias_shift)
        made[name] = (model_dir, trace_transformers(model_dir, directory / f"{name}.transformers.ndjson"))
    return directory, made


def reference_margins(trace):
    """Every routed token's ``logit_margin`` in ``trace``, with its (pass, layer, row)."""
    margins = []
    for event in model_trace.read_trace(str(trace))[1]:
        if event["event"] == "router":
            margins += [(token["logit_margin"], event["pass"], event["layer"], token["row"])
                        for token in event["tokens"]]
    return sorted(margins)


def layer_verdicts(report):
    return {row["layer"]: row["verdict"] for row in report["routing"]["layers"]}


@pytest.mark.parametrize("case", ["qwen3_moe", "deepseek_v3"])
def test_the_clean_port_routes_as_transformers_but_for_near_ties(models, case):
    directory, made = models
    model_dir, reference = made[case]
    port = trace_port(directory, model_dir, f"{case}-clean")
    code, report = diff(reference, port)
    assert (code, report["first_divergence"]) == (0, None), report["first_divergence"]
    # Every stage, attention and logits of the four passes on both sides.
    assert report["missing_count"] == report["extra_count"] == 0, (report["missing"], report["extra"])
    routing = report["routing"]
    # Every MoE layer of every pass compared, every token.
    moe_layers = [i for i in range(4) if case == "qwen3_moe" or i >= 1]
    assert routing["reference_calls"] == routing["other_calls"] == len(moe_layers) * (DECODE + 1)
    assert routing["tokens"] == len(moe_layers) * len(IDS)
    assert sorted(layer_verdicts(report)) == moe_layers
    # No token routed differently past the port's error, no weights past it.
    assert routing["divergences"] == routing["weights_differ"] == 0, routing
    assert routing["differing"] == routing["near_ties"]
    assert set(layer_verdicts(report).values()) <= set(AGREE), layer_verdicts(report)
    # The closest calls: Qwen's near-tie pair (two experts' router rows ~2e-6 apart in
    # NEAR_TIE_LAYER) gives tokens whose reference margin is within ten times the port's largest
    # logit error, and the port routes them as the reference does or calls them near-ties.
    error = max(row["max_logit_error"] for row in routing["layers"])
    close = [m for m in reference_margins(reference) if m[0] < 10 * error]
    if case == "qwen3_moe":
        assert close and all(layer == moe_models.NEAR_TIE_LAYER for _, _, layer, _ in close), close
    print(f"{case}: {routing['near_ties']} near-ties of {routing['tokens']} tokens; port's logit error up "
          f"to {error:.1e}; {len(close)} reference margins under 10x that: {close}")


@pytest.mark.parametrize("bug,variant,verdict", BUGS, ids=[f"{bug}-{variant}" for bug, variant, _ in BUGS])
def test_each_routing_bug_is_named_at_its_layer(models, bug, variant, verdict):
    directory, made = models
    model_dir, reference = made[variant]
    port = trace_port(directory, model_dir, f"{variant}-{bug}", bug)
    code, report = diff(reference, port)
    verdicts = layer_verdicts(report)
    # The layers before the bug's agree; the bug's is named, as routing or weights.
    assert all(verdicts[layer] in AGREE for layer in verdicts if layer < LAYER), verdicts
    assert verdicts[LAYER] == verdict, (verdicts, report["routing"]["notes"])
    row = next(row for row in report["routing"]["layers"] if row["layer"] == LAYER)
    assert row["flagged"], row
    if verdict == "routing":
        first = report["routing"]["first_divergence"]
        assert (first["pass"], first["layer"], first["verdict"]) == (0, LAYER, "divergence"), first
    elif verdict == "weights":
        assert row["divergences"] == 0 and row["weights_differ"] > 0, row
    else:
        assert row["divergences"] == row["weights_differ"] == 0, row
        logits = row["router_logits"]
        assert logits["own_error"] and logits["input"] == "within" and logits["ratio"] > 10, logits
    # The later layers' routers are the clean port's: whatever they inherit, none is named for
    # its own logits, and no layer blames its experts (every bug is in a router).
    assert all(verdicts[layer] != "router_logits" for layer in verdicts if layer > LAYER), verdicts
    rows = report["routing"]["layers"]
    assert not any(row["computation_not_choice"] for row in rows), [(r["layer"], r["mlp_out_gain"]) for r in rows]
    # Before the router, the layer is the clean port's: the stages diverge from mlp_out on.
    assert code == 1
    first = report["first_divergence"]
    assert (first["layer"], first["stage"]) == (LAYER, "mlp_out"), first


@pytest.mark.parametrize("case", ["qwen3_moe", "deepseek_v3"])
def test_a_bf16_router_is_named_by_its_logits_and_its_flips_are_near_ties(models, case):
    """Router logits in bf16 in every layer (vllm #58076): a logit error of ~1e-2 where the clean
    port's is ~1e-6. The first MoE layer's router, its input within the tolerance, is named by
    its own logits (``router_logits``); the flips, the closest choices (Qwen's near-tie pair in
    ``NEAR_TIE_LAYER``: 2 tokens; DeepSeek-V3's closest margin, 1e-3 in layer 3: 1 token), are
    each a near-tie by that error, and no weight moves past it."""
    directory, made = models
    model_dir, reference = made[case]
    _, report = diff(reference, trace_port(directory, model_dir, f"{case}-router-bf16-every-layer", "router-bf16",
                                                at=None))
    routing = report["routing"]
    assert routing["near_ties"] >= 1 and routing["differing"] == routing["near_ties"], routing
    assert routing["divergences"] == routing["weights_differ"] == 0, routing
    verdicts = layer_verdicts(report)
    assert verdicts[min(verdicts)] == "router_logits", verdicts
    assert set(verdicts.values()) <= {"router_logits", *AGREE}, verdicts
    assert all(row["max_logit_error"] > 1e-3 for row in routing["layers"]), routing["layers"]
    first = routing["first_difference"]
    assert first["verdict"] == "near_tie" and first["reference_logit_margin"] < first["logit_error"], first
    print(f"{case}: {verdicts}")


@pytest.mark.parametrize("case", ["qwen3_moe", "deepseek_v3"])
def test_three_ways_with_llama_cpp_as_the_floor(models, case):
    """The three sides on the same tokens: llama.cpp routes every token as transformers does
    (the same experts, weights within its logit error); with llama.cpp as the floor, the clean
    port is flagged nowhere, and a routing bug and a bf16 router are still named at their layer
    (their differences far past llama.cpp's own)."""
    pytest.importorskip("llama_cpp")
    directory, made = models
    model_dir, reference = made[case]
    llama = trace_llama_cpp(model_dir, directory / f"{case}.llama_cpp.ndjson")
    code, alone = diff(reference, llama)
    routing = alone["routing"]
    assert code == 0 and routing["tokens"] == routing["other_calls"] // (DECODE + 1) * len(IDS), routing
    assert routing["divergences"] == routing["weights_differ"] == 0, routing
    assert set(layer_verdicts(alone).values()) <= set(AGREE), layer_verdicts(alone)
    error = max(row["max_logit_error"] for row in routing["layers"])
    print(f"{case}: llama.cpp against transformers: {routing['tokens'] - routing['differing']} of "
          f"{routing['tokens']} tokens chose the same experts, {routing['near_ties']} near-ties; "
          f"router-logit error up to {error:.1e}")

    def with_floor(name, bug=None):
        port = trace_port(directory, model_dir, f"{case}-{name}", bug)
        code, report = diff(reference, port, "--floor", str(llama))
        assert report["routing"]["floor_calls"] == report["routing"]["reference_calls"], report["routing"]
        return code, report, {row["layer"]: row for row in report["routing"]["layers"]}

    code, report, rows = with_floor("clean")
    assert code == 0 and report["first_divergence"] is None, report["first_divergence"]
    assert not any(row["flagged"] for row in rows.values()), rows
    for name, bug, verdict in (("floor-off-by-one", "experts-off-by-one", "routing"),
                               ("floor-bf16", "router-bf16", "router_logits")):
        code, report, rows = with_floor(name, bug)
        assert code == 1 and (report["first_divergence"]["layer"], report["first_divergence"]["stage"]) == (
            LAYER, "mlp_out"), report["first_divergence"]
        assert (rows[LAYER]["verdict"], rows[LAYER]["flagged"]) == (verdict, True), rows[LAYER]
        assert not any(row["flagged"] for layer, row in rows.items() if layer < LAYER), rows
