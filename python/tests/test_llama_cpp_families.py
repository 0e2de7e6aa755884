"""Every llama.cpp node table run by llama.cpp: a tiny random GGUF of each family (transformers'
own class from a small config, converted by llama.cpp's own converter: ``tiny_gguf.py``), one
6-token pass each. Each must record the stages its table promises with no node missing, pass
the stage check on its values (``model_trace.llama_cpp`` raises StageMapError otherwise) with
the identities its block obeys actually checked, and say its architecture in the header.

The GGUFs are made once (about 35 s for all, one converter process) and cached under
``$MODEL_TRACE_MODELS``.
"""

import warnings

import pytest

import model_trace

llama_cpp = pytest.importorskip("model_trace.llama_cpp")
stage_check = pytest.importorskip("model_trace.stage_check")
tiny_gguf = pytest.importorskip("tiny_gguf")

PRE_NORM = ["input", "attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out", "output"]
PRE_NORM_QK = ["input", "attn_in", "q_norm", "k_norm", "attn_out", "resid_mid", "mlp_in", "mlp_out", "output"]
PRE_NORM_IDENTITIES = {"resid_mid = input + attn_out", "output = resid_mid + mlp_out", "attn_in = norm(input)",
                       "mlp_in = norm(resid_mid)"}
SANDWICH_IDENTITIES = {"resid_mid = input + attn_post_norm", "output = resid_mid + mlp_post_norm",
                       "attn_in = norm(input)", "mlp_in = norm(resid_mid)", "attn_post_norm = norm(attn_out)",
                       "mlp_post_norm = norm(mlp_out)"}
PARALLEL_IDENTITIES = {"output = input + attn_out + mlp_out", "attn_in = norm(input)"}

#: case -> (llama.cpp architecture, the stages a layer records, the identities checked on them).
CASES = {
    "llama": ("llama", PRE_NORM, PRE_NORM_IDENTITIES),
    "mistral": ("llama", PRE_NORM, PRE_NORM_IDENTITIES),
    "mixtral": ("llama", PRE_NORM, PRE_NORM_IDENTITIES),
    "qwen2": ("qwen2", PRE_NORM, PRE_NORM_IDENTITIES),
    "qwen2_moe": ("qwen2moe", PRE_NORM, PRE_NORM_IDENTITIES),
    "qwen3": ("qwen3", PRE_NORM_QK, PRE_NORM_IDENTITIES),
    "qwen3_moe": ("qwen3moe", PRE_NORM_QK, PRE_NORM_IDENTITIES),
    "gemma": ("gemma", PRE_NORM, PRE_NORM_IDENTITIES),
    "gemma2": ("gemma2", ["input", "attn_in", "attn_out", "attn_post_norm", "resid_mid", "mlp_in", "mlp_out",
                          "mlp_post_norm", "output"], SANDWICH_IDENTITIES),
    "gemma3_text": ("gemma3", ["input", "attn_in", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid",
                               "mlp_in", "mlp_out", "mlp_post_norm", "output"], SANDWICH_IDENTITIES),
    "phi3": ("phi3", PRE_NORM, PRE_NORM_IDENTITIES),
    "olmo2": ("olmo2", ["input", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_out",
                        "mlp_post_norm", "output"],
              {"resid_mid = input + attn_post_norm", "output = resid_mid + mlp_post_norm",
               "attn_post_norm = norm(attn_out)", "mlp_post_norm = norm(mlp_out)"}),
    "granite": ("granite", PRE_NORM, {"resid_mid = input + 0.5·attn_out", "output = resid_mid + 0.5·mlp_out",
                                      "attn_in = norm(input)", "mlp_in = norm(resid_mid)"}),
    "starcoder2": ("starcoder2", PRE_NORM, PRE_NORM_IDENTITIES),
    "stablelm": ("stablelm", PRE_NORM, PRE_NORM_IDENTITIES),
    "falcon": ("falcon", ["input", "attn_in", "attn_out", "mlp_out", "output"], PARALLEL_IDENTITIES),
    "falcon_new": ("falcon", ["input", "attn_in", "mlp_in", "attn_out", "mlp_out", "output"],
                   PARALLEL_IDENTITIES | {"mlp_in = norm(input)"}),
    "gpt2": ("gpt2", PRE_NORM, PRE_NORM_IDENTITIES),
}

TOKENS = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def ggufs():
    return tiny_gguf.cached(list(CASES))


def test_every_llama_cpp_architecture_with_a_table_has_a_case():
    assert {architecture for architecture, _, _ in CASES.values()} == set(llama_cpp.TABLES)
    assert set(CASES) == set(tiny_gguf.CONFIGS)


def test_each_case_converts_to_the_architecture_its_family_file_says():
    """llama.cpp's converter writes the architecture a family file declares (Mistral's and
    Mixtral's GGUFs are ``llama``): the cases are transformers' model types."""
    from model_trace import families

    by_name = {families.family_name(family): family for family in families.FAMILY_FILES}
    for case, (architecture, _, _) in CASES.items():
        family = by_name[{"gemma3_text": "gemma3", "falcon_new": "falcon"}.get(case, case)]
        assert families.gguf_architecture(family) == architecture, case


@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_runs_the_node_table_and_the_stage_check_holds(case, ggufs, tmp_path):
    architecture, stages, identities = CASES[case]
    out = tmp_path / f"{case}.ndjson"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llama_cpp.run(str(ggufs[case]), [TOKENS], str(out), capture="pass=0")
    missing = [str(w.message) for w in caught if issubclass(w.category, llama_cpp.MissingNodeWarning)]
    assert not missing, missing
    header, events = model_trace.read_trace(str(out))
    assert header["metadata"]["extra"]["architecture"] == architecture
    layers = [e for e in events if e["event"] == "layer"]
    assert [e["layer"] for e in layers] == [0, 1]
    for event in layers:
        assert [s["name"] for s in event["stages"]] == stages, event["layer"]
    attention = [e for e in events if e["event"] == "attention"]
    assert [e["layer"] for e in attention] == [0, 1]
    report = stage_check.check_captured_trace(str(out))
    assert not report.failures, [str(f) for f in report.failures]
    assert {o.identity for o in report.checked} == identities
    assert report.largest_error() < 1e-4, report.largest()
