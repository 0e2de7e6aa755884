"""Routing on both reference sides: the random Qwen3-MoE and DeepSeek-V3 of ``moe_models.py``
traced through transformers (``model_trace.torch``) and through llama.cpp
(``model_trace.llama_cpp``, the same token ids, F32 weights and KV cache). Each MoE layer has a
router event per pass on both sides; llama.cpp's chosen experts equal transformers' on every
token except where transformers' ``logit_margin`` is within the two sides' router-logit error
(a near-tie, which float rounding may flip); their weights agree. The models themselves are
checked to be what the tests need: mostly decisive choices, a few near-ties, a selection bias
that changes choices. ``model-trace diff --json`` reads both sides' router events and finds them
routed alike.

Cost: ~15 s to make both models the first time (cached after), then ~6 s for the tests (measured
here: two 24-token passes on each side, 4 + 3 router calls of 24 tokens).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_models  # noqa: E402

from conftest import REPO, model_trace_cli  # noqa: E402
from model_trace import llama_cpp  # noqa: E402
from model_trace.format import read_trace  # noqa: E402
from model_trace.torch import trace  # noqa: E402

TOKENS = [(i * 37 + 11) % 256 for i in range(24)]
#: The MoE layers of each model (DeepSeek-V3's layer 0 is dense).
MOE_LAYERS = {"qwen3_moe": [0, 1, 2, 3], "deepseek_v3": [1, 2, 3]}
#: The sum of each token's weights: renormalised, times DeepSeek-V3's routed_scaling_factor.
WEIGHT_SUMS = {"qwen3_moe": 1.0, "deepseek_v3": 2.5}


@pytest.fixture(scope="module")
def models():
    return moe_models.cached()


def routers(path):
    _, events = read_trace(str(path))
    return {e["layer"]: e for e in events if e["event"] == "router"}


@pytest.fixture(scope="module")
def traces(models, tmp_path_factory):
    """case -> (transformers' router events, llama.cpp's, transformers' full router logits, the
    model, the folder of both traces)."""
    from transformers import AutoModelForCausalLM

    made = {}
    for case, directory in models.items():
        folder = tmp_path_factory.mktemp(case)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
        logits = {}
        hooks = [gate.register_forward_hook(lambda _m, _a, out, layer=layer: logits.__setitem__(layer, out[0].numpy()))
                 for layer, gate in moe_models.routers(model).items()]
        with trace(model, str(folder / "transformers.ndjson")), torch.no_grad():
            model(torch.tensor([TOKENS]))
        for hook in hooks:
            hook.remove()
        llama_cpp.run(str(moe_models.gguf(directory)), [TOKENS], str(folder / "llama_cpp.ndjson"), kv="f32")
        made[case] = (routers(folder / "transformers.ndjson"), routers(folder / "llama_cpp.ndjson"), logits, model,
                      folder)
    return made


def logit_error(reference, other):
    """The largest difference of a router logit both sides recorded for the same token and
    expert (the chosen experts and the runner-up)."""
    worst = 0.0
    for a, b in zip(reference["tokens"], other["tokens"]):
        ids_a = a["experts"] + ([a["runner_up"]] if a["runner_up"] is not None else [])
        ids_b = b["experts"] + ([b["runner_up"]] if b["runner_up"] is not None else [])
        mine = dict(zip(ids_b, b["logits"]))
        worst = max([worst] + [abs(l - mine[e]) for e, l in zip(ids_a, a["logits"]) if e in mine])
    return worst


@pytest.mark.parametrize("case", list(MOE_LAYERS))
def test_llama_cpp_routes_as_transformers_but_for_near_ties(traces, case):
    reference, other, _, _, _ = traces[case]
    assert sorted(reference) == sorted(other) == MOE_LAYERS[case]
    differing = near_ties = 0
    for layer in MOE_LAYERS[case]:
        a, b = reference[layer], other[layer]
        assert (a["scoring"], a.get("groups"), a["selection_bias"]) == (b["scoring"], b.get("groups"),
                                                                        b["selection_bias"])
        assert a["num_experts"] == b["num_experts"] and len(a["tokens"]) == len(b["tokens"]) == len(TOKENS)
        error = logit_error(a, b)
        assert error < 1e-4, f"layer {layer}: router logits differ by {error}"
        for x, y in zip(a["tokens"], b["tokens"]):
            for weights in (x["weights"], y["weights"]):
                assert abs(sum(weights) - WEIGHT_SUMS[case]) < 1e-5
            if sorted(x["experts"]) != sorted(y["experts"]):
                differing += 1
                assert x["logit_margin"] <= error, (f"layer {layer} row {x['row']}: {x['experts']} against "
                                                    f"{y['experts']}, margin {x['logit_margin']} > error {error}")
                continue
            near_ties += x["logit_margin"] <= error
            ours, theirs = dict(zip(x["experts"], x["weights"])), dict(zip(y["experts"], y["weights"]))
            assert max(abs(ours[e] - theirs[e]) for e in ours) < 1e-5
        assert a["load"] == b["load"] or differing
    print(f"{case}: {differing} tokens routed differently, {near_ties} near-ties routed alike")


@pytest.mark.parametrize("case", list(MOE_LAYERS))
def test_the_models_have_decisive_choices_and_a_few_near_ties(traces, case):
    margins = np.array([t["logit_margin"] for e in traces[case][0].values() for t in e["tokens"]])
    assert np.median(margins) > 1e-2 and np.mean(margins > 1e-3) > 0.85, np.quantile(margins, [0.1, 0.5])
    assert 1 <= np.sum(margins < 1e-4) <= 0.1 * margins.size, np.sort(margins)[:8]


def test_deepseek_v3s_selection_bias_changes_choices_and_never_weights(traces):
    reference, _, logits, model, _ = traces["deepseek_v3"]
    changed = 0
    for layer, gate in moe_models.routers(model).items():
        bias = gate.e_score_correction_bias.detach().numpy().astype(np.float64)
        groups, top_groups, k = gate.num_group, gate.topk_group, gate.top_k
        recorded = np.sort(np.array([t["experts"] for t in reference[layer]["tokens"]]), axis=-1)
        assert (moe_models.grouped_choice(logits[layer], bias, groups, top_groups, k) == recorded).all()
        unbiased = moe_models.grouped_choice(logits[layer], 0.0, groups, top_groups, k)
        changed += int((unbiased != recorded).any(-1).sum())
        for token, row in zip(reference[layer]["tokens"], logits[layer]):
            scores = 1.0 / (1.0 + np.exp(-row[token["experts"]].astype(np.float64)))
            np.testing.assert_allclose(token["weights"], 2.5 * scores / scores.sum(), rtol=1e-5)
    print(f"deepseek_v3: the selection bias changes {changed} of {3 * len(TOKENS)} tokens' choices")
    assert changed >= 5


def test_probabilities_returned_as_logits_are_recorded_as_their_logarithm(traces, tmp_path):
    """Early transformers 5 routers returned softmax probabilities as logits: recorded as their
    logarithm, the same choice and margins as the logits give."""
    reference, _, _, model, _ = traces["qwen3_moe"]

    def as_probabilities(_module, _args, output):
        return torch.softmax(output[0].float(), dim=-1), output[1], output[2]

    hooks = [gate.register_forward_hook(as_probabilities) for gate in moe_models.routers(model).values()]
    path = tmp_path / "probabilities.ndjson"
    try:
        with pytest.warns(UserWarning, match="probabilities as their logits"):
            with trace(model, str(path)), torch.no_grad():
                model(torch.tensor([TOKENS]))
    finally:
        for hook in hooks:
            hook.remove()
    header, _ = read_trace(str(path))
    assert header["metadata"]["extra"]["router_logits"].startswith("log of the probabilities")
    for layer, event in routers(path).items():
        for logged, logits in zip(event["tokens"], reference[layer]["tokens"]):
            assert (logged["experts"], logged["runner_up"]) == (logits["experts"], logits["runner_up"])
            assert logged["margin"] == pytest.approx(logits["margin"], abs=1e-6)
            assert logged["logit_margin"] == pytest.approx(logits["logit_margin"], rel=1e-3, abs=2e-6)


@pytest.mark.parametrize("case", ["mixtral", "qwen2_moe"])
def test_the_other_moe_families_routers_are_recorded_per_layer(case, tmp_path):
    """Mixtral's and Qwen 2 MoE's routers (the tiny random models of tiny_gguf.py): a softmax
    router event per layer, its experts the top-k of its own scores."""
    import tiny_gguf
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_gguf.config(case), dtype=torch.float32).eval()
    path = tmp_path / f"{case}.ndjson"
    with trace(model, str(path)), torch.no_grad():
        model(torch.tensor([TOKENS]))
    events = routers(path)
    assert sorted(events) == [0, 1]
    for event in events.values():
        assert (event["scoring"], event["selection_bias"], "groups" in event) == ("softmax", False, False)
        assert event["tracepoint"] == "mlp.gate" and sum(event["load"]) == 2 * len(TOKENS)
        assert all(t["margin"] >= 0 for t in event["tokens"])
        if case == "mixtral":  # Mixtral always renormalises its top-k
            assert all(abs(sum(t["weights"]) - 1) < 1e-5 for t in event["tokens"])


@pytest.mark.parametrize("case", list(MOE_LAYERS))
def test_model_trace_diff_reads_both_sides_routers(traces, case):
    """The CLI reads the router events both Python writers wrote: ``model-trace diff --json``
    compares every token of every MoE layer and finds them routed alike."""
    folder = traces[case][4]
    result = subprocess.run(model_trace_cli("diff", "--json", folder / "transformers.ndjson",
                                            folder / "llama_cpp.ndjson"), cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr
    routing = json.loads(result.stdout)["routing"]
    assert (routing["tokens"], routing["differing"], routing["divergences"], routing["weights_differ"]) == (
        len(MOE_LAYERS[case]) * len(TOKENS), 0, 0, 0)
    assert [layer["layer"] for layer in routing["layers"]] == MOE_LAYERS[case]
