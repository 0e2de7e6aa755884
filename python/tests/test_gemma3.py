"""Gemma 3 270M (the real Q4_K_M weights ``scripts/fetch-models`` assembles) traced by llama.cpp
and by transformers, with no architecture written by hand on either side.

* llama.cpp: the ``gemma3`` node table gives every stage its graph computes (the scaled
  embeddings as layer 0's input, the per-head query/key norms, both post-norms, ``sa_out`` as
  ``resid_mid``), the stage check passes on them, greedy decoding gives transformers' tokens;
  read with a wrong table (Gemma 1's, which has no post-norms) the check names the identity that
  breaks, and with Llama's the nodes it lacks are warned about.
* transformers (the GGUF converted once and cached: ``gemma3_weights.py``):
  ``model_trace.torch.trace(model, path)`` detects Gemma 3, its check passes, and ``model-trace
  diff`` lines it up with llama.cpp stage for stage.

Time is kept small: one llama.cpp run of 8 passes with pass 0 captured, two 1-pass runs for the
wrong tables, one transformers conversion per GGUF (cached), one traced transformers pass.
"""

import json
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import model_trace
from conftest import REPO, model_trace_cli
from gemma3_weights import GREEDY_IDS, PROMPT, PROMPT_IDS, gguf

llama_cpp = pytest.importorskip("model_trace.llama_cpp")
stage_check = pytest.importorskip("model_trace.stage_check")

LAYERS = 18
#: The stages the gemma3 node table promises, in the order a layer records them.
GEMMA3_STAGES = ["input", "attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_in",
                 "mlp_out", "mlp_post_norm", "output"]


def layer_events(path, pass_index=0):
    _, events = model_trace.read_trace(str(path))
    return [e for e in events if e["event"] == "layer" and e["pass"] == pass_index]


def chosen_tokens(path):
    _, events = model_trace.read_trace(str(path))
    return [e["batch_rows"][0]["top_tokens"][0] for e in events
            if e["event"] == "logits" and e["tracepoint"] == "logits"]


def rust_check(path):
    """``model-trace check TRACE --json`` (exit code, stdout, stderr), or None while the
    command does not exist in this checkout."""
    command = model_trace_cli("check", "--json", path)
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    if result.returncode == 2 and re.search(r"unrecognized subcommand|invalid value 'check'", result.stderr):
        return None
    return result


@pytest.fixture(scope="module")
def llama_greedy(tmp_path_factory):
    """llama.cpp's greedy run from the text, as a user runs it: 8 passes, pass 0 captured."""
    out = tmp_path_factory.mktemp("gemma3-llama") / "llama.ndjson"
    command = [sys.executable, "-m", "model_trace.llama_cpp", str(gguf()), "--prompt", PROMPT, "--max-tokens", "8",
               "--out", str(out), "--capture", "pass=0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result.stderr


def test_llama_cpp_records_every_stage_the_gemma3_table_promises(llama_greedy):
    path, stderr = llama_greedy
    # No node of the table is missing from the graph (each would be a MissingNodeWarning).
    assert "MissingNodeWarning" not in stderr, stderr
    header, _ = model_trace.read_trace(str(path))
    extra = header["metadata"]["extra"]
    assert (extra["architecture"], extra["node_table"], extra["stage_check"]) == ("gemma3", "gemma3", "first pass")
    layers = layer_events(path)
    assert [e["layer"] for e in layers] == list(range(LAYERS))
    for event in layers:
        assert [s["name"] for s in event["stages"]] == GEMMA3_STAGES, event["layer"]
        shapes = {s["name"]: s["tensor"]["shape"] for s in event["stages"]}
        # Per head, before RoPE, as transformers' q_norm/k_norm return them: 4 query heads, 1 KV head.
        assert shapes["q_norm"] == [1, 6, 4, 256] and shapes["k_norm"] == [1, 6, 1, 256]
        assert all(shapes[s] == [1, 6, 640] for s in GEMMA3_STAGES if s not in ("q_norm", "k_norm"))


def test_llama_cpp_greedy_gives_transformers_tokens(llama_greedy):
    path, _ = llama_greedy
    _, events = model_trace.read_trace(str(path))
    begins = [e for e in events if e["event"] == "pass_begin"]
    # The GGUF's tokenizer adds BOS (2), as Gemma's does.
    assert begins[0]["tokens"] == PROMPT_IDS
    assert chosen_tokens(path) == GREEDY_IDS


def test_the_stage_check_passes_on_llama_cpp_gemma3(llama_greedy):
    path, _ = llama_greedy
    report = stage_check.check_captured_trace(str(path))
    assert not report.failures, [str(f) for f in report.failures]
    identities = {o.identity for o in report.checked}
    # R1/R2 with the post-norms as the branches, and all four norm identities, on every layer.
    assert identities == {"resid_mid = input + attn_post_norm", "output = resid_mid + mlp_post_norm",
                          "attn_in = norm(input)", "mlp_in = norm(resid_mid)", "attn_post_norm = norm(attn_out)",
                          "mlp_post_norm = norm(mlp_out)"}
    assert len(report.checked) == 6 * LAYERS
    assert report.largest_error() < 1e-3, report.largest()


def test_the_rust_check_passes_on_llama_cpp_gemma3(llama_greedy):
    path, _ = llama_greedy
    result = rust_check(path)
    if result is None:
        pytest.skip("model-trace check is not in this checkout yet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def run_one_pass(tmp_path, **options):
    """One llama.cpp pass of the prompt, in process; the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llama_cpp.run(str(gguf()), [PROMPT_IDS], str(tmp_path / "one.ndjson"), **options)
    return [str(w.message) for w in caught if issubclass(w.category, llama_cpp.MissingNodeWarning)]


def test_a_wrong_node_table_fails_the_stage_check_at_the_identity_it_breaks(tmp_path):
    # Gemma 1's table has no post-norms: it takes the raw attention output for the branch that
    # joins the stream, and Gemma 3's sa_out is not input + attn_out.
    with pytest.raises(stage_check.StageMapError) as raised:
        run_one_pass(tmp_path, node_table="gemma")
    message = str(raised.value)
    assert "llama.cpp's 'gemma3' graph read with the 'gemma' node table" in message
    assert "layer 0, resid_mid: `resid_mid = input + attn_out` fails" in message


def test_nodes_a_table_expects_and_the_graph_lacks_are_warned_once_each(tmp_path):
    missing = run_one_pass(tmp_path, node_table="llama", check_stages=False)
    # Llama names its attention output and its residual ffn_inp; Gemma 3's graph has neither.
    assert len(missing) == 2, missing
    assert any("no 'attn_out' node in any layer: the stage 'attn_out' is absent" in m for m in missing), missing
    assert any("no 'ffn_inp' node in any layer: the stage 'resid_mid' is absent" in m for m in missing), missing
    header, _ = model_trace.read_trace(str(tmp_path / "one.ndjson"))
    assert header["metadata"]["extra"]["stage_check"] == "off"



# --- transformers (the cached conversion) against llama.cpp -------------------------------------

@pytest.fixture(scope="module")
def transformers_model():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from gemma3_weights import transformers_dir

    # Eager attention: the probabilities are recorded, as llama.cpp's kq_soft_max.
    model = AutoModelForCausalLM.from_pretrained(str(transformers_dir()), dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def both_traced(transformers_model, tmp_path_factory):
    """The prompt pass traced by transformers (no architecture given) and by llama.cpp fed the
    same ids, both captured."""
    import torch

    import model_trace.torch

    directory = tmp_path_factory.mktemp("gemma3-both")
    reference = directory / "transformers.ndjson"
    with torch.no_grad(), model_trace.torch.trace(transformers_model, str(reference), capture="pass=0"):
        transformers_model(input_ids=torch.tensor([PROMPT_IDS]), use_cache=False)
    llama = directory / "llama.ndjson"
    llama_cpp.run(str(gguf()), llama_cpp.passes_of(str(reference)), str(llama), capture="pass=0")
    return reference, llama


def test_transformers_greedy_gives_the_design_tokens(transformers_model):
    import torch

    with torch.no_grad():
        out = transformers_model.generate(torch.tensor([PROMPT_IDS]), max_new_tokens=8, do_sample=False)
    assert out[0, len(PROMPT_IDS):].tolist() == GREEDY_IDS


def test_transformers_traces_gemma3_with_no_architecture_given_and_the_check_passes(both_traced):
    reference, _ = both_traced
    header, _ = model_trace.read_trace(str(reference))
    assert header["metadata"]["extra"]["architecture"] == "gemma3"
    assert header["metadata"]["extra"]["stage_check"] == "first pass"
    layers = layer_events(reference)
    assert len(layers) == LAYERS
    for event in layers:
        assert [s["name"] for s in event["stages"]] == GEMMA3_STAGES, event["layer"]
    report = stage_check.check_captured_trace(str(reference))
    assert not report.failures and len(report.checked) == 6 * LAYERS, [str(f) for f in report.failures]


def test_llama_cpp_and_transformers_line_up_stage_for_stage(both_traced):
    from test_reference_diff import diff

    reference, llama = both_traced
    code, report = diff(reference, llama, "--check-error-stat", "norm", "--rtol", "0.1")
    assert report["missing_count"] == report["extra_count"] == 0, (report["missing"], report["extra"])
    assert report["compared"]["shape_mismatch"] == 0
    # Every stage of every layer, each layer's attention, and the logits.
    assert report["compared"]["matched"] == LAYERS * (len(GEMMA3_STAGES) + 1) + 1
