"""Every llama.cpp node table run by llama.cpp: a tiny random GGUF of each family (transformers'
own class from a small config, converted by llama.cpp's own converter: ``tiny_gguf.py``), one
6-token pass each. Each must record the stages its table promises with no node missing, pass
the stage check on its values (``model_trace.llama_cpp`` raises StageMapError otherwise) with
the identities its block obeys actually checked, and say its architecture in the header.

The cases come from the family files (``TINY_MODELS``, or a family's name as the model type), and
so does what each must record: the stages of the family's transformers preset for that config
(the two writers of a family record the same stages), and the identities those stages promise.
A new family file is run here with no edit.

The GGUFs are made once (about 35 s for all, one converter process) and cached under
``$MODEL_TRACE_MODELS``.
"""

import warnings

import numpy as np
import pytest

import model_trace

llama_cpp = pytest.importorskip("model_trace.llama_cpp")
stage_check = pytest.importorskip("model_trace.stage_check")
tiny_gguf = pytest.importorskip("tiny_gguf")

from model_trace import families  # noqa: E402

#: case -> (its family file, its tiny model): every family file's ``TINY_MODELS`` (tiny_gguf).
CASES = tiny_gguf.CASES


def promised_identities(stages, r=1.0):
    """The identities the stage check promises on a layer that records ``stages`` with residual
    multiplier ``r``, as docs/trace-format.md's *The stage check* states them (R1 to R3, N1 to
    N4; q/k norms unchecked), written from the doc, not from ``stage_check``'s code."""
    scaled = "" if r == 1.0 else f"{r:g}·"
    a = "attn_post_norm" if "attn_post_norm" in stages else "attn_out"
    m = "mlp_post_norm" if "mlp_post_norm" in stages else "mlp_out"
    if "resid_mid" in stages:
        promised = {f"resid_mid = input + {scaled}{a}", f"output = resid_mid + {scaled}{m}"}
    else:
        promised = {f"output = input + {a} + {m}" if r == 1.0 else f"output = input + {r:g}·({a} + {m})"}
    sources = {"attn_in": "input", "mlp_in": "resid_mid" if "resid_mid" in stages else "input",
               "attn_post_norm": "attn_out", "mlp_post_norm": "mlp_out"}
    return promised | {f"{lhs} = norm({source})" for lhs, source in sources.items() if {lhs, source} <= set(stages)}


def expected(case):
    """(llama.cpp architecture, the stages a layer records, the identities checked on them) of
    ``case``: the stages of its family's preset for the tiny model's config, which the node table
    (or one of its variants) must name, and the identities those stages promise."""
    family, _ = CASES[case]
    config = tiny_gguf.config(case)
    preset = families.choose([preset.layer_class for preset in family.ARCHITECTURES], config, family.ARCHITECTURES)
    r = float(getattr(config, "residual_multiplier")) if "residual_multiplier" in preset.config_metadata else 1.0
    stages = ["input", *preset.stages, "output"]
    return families.gguf_architecture(family), stages, promised_identities(stages, r)


PRE_NORM = ["input", "attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out", "output"]
PRE_NORM_QK = ["input", "attn_in", "q_norm", "k_norm", "attn_out", "resid_mid", "mlp_in", "mlp_out", "output"]
PRE_NORM_IDENTITIES = {"resid_mid = input + attn_out", "output = resid_mid + mlp_out", "attn_in = norm(input)",
                       "mlp_in = norm(resid_mid)"}
SANDWICH_IDENTITIES = {"resid_mid = input + attn_post_norm", "output = resid_mid + mlp_post_norm",
                       "attn_in = norm(input)", "mlp_in = norm(resid_mid)", "attn_post_norm = norm(attn_out)",
                       "mlp_post_norm = norm(mlp_out)"}
PARALLEL_IDENTITIES = {"output = input + attn_out + mlp_out", "attn_in = norm(input)"}

#: The expectations of the families of today, written out (a new family needs no line here): what
#: llama.cpp records of them, so that a change of a family's preset or of the stage check's
#: identities shows here too.
WRITTEN_OUT = {
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
    "olmo2": ("olmo2", ["input", "q_norm", "k_norm", "attn_out", "attn_post_norm", "resid_mid", "mlp_out",
                        "mlp_post_norm", "output"],
              {"resid_mid = input + attn_post_norm", "output = resid_mid + mlp_post_norm",
               "attn_post_norm = norm(attn_out)", "mlp_post_norm = norm(mlp_out)"}),
    "phi3": ("phi3", PRE_NORM, PRE_NORM_IDENTITIES),
    "granite": ("granite", PRE_NORM, {"resid_mid = input + 0.5·attn_out", "output = resid_mid + 0.5·mlp_out",
                                      "attn_in = norm(input)", "mlp_in = norm(resid_mid)"}),
    "starcoder2": ("starcoder2", PRE_NORM, PRE_NORM_IDENTITIES),
    "stablelm": ("stablelm", PRE_NORM, PRE_NORM_IDENTITIES),
    "falcon": ("falcon", ["input", "attn_in", "attn_out", "mlp_out", "output"], PARALLEL_IDENTITIES),
    "falcon_new": ("falcon", ["input", "attn_in", "mlp_in", "attn_out", "mlp_out", "output"],
                   PARALLEL_IDENTITIES | {"mlp_in = norm(input)"}),
    "gpt2": ("gpt2", PRE_NORM, PRE_NORM_IDENTITIES),
    "deepseek_v3": ("deepseek2", PRE_NORM, PRE_NORM_IDENTITIES),
}

#: The layers of each tiny model whose MLP is a mixture of experts: a router event each on
#: llama.cpp's side (the others: none). DeepSeek-V3's layer 0 is dense (``first_k_dense_replace``).
ROUTED = {"mixtral": [0, 1], "qwen2_moe": [0, 1], "qwen3_moe": [0, 1], "deepseek_v3": [1]}

TOKENS = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def ggufs():
    return tiny_gguf.cached(list(CASES))


def test_every_llama_cpp_architecture_and_variant_is_run():
    """Every family llama.cpp reads has a tiny model, one case a name; every node table, and
    every variant of one, records the stages of some case."""
    runs = [(family, case) for family in families.FAMILY_FILES for case in families.tiny_models(family)]
    assert len({case for _, case in runs}) == len(runs) == len(CASES), "a case's name twice"
    assert {families.family_name(f) for f, _ in runs} == {families.family_name(f) for f in families.FAMILY_FILES
                                                          if families.gguf_architecture(f)}
    cases = {case: expected(case) for case in CASES}
    assert {architecture for architecture, _, _ in cases.values()} == set(llama_cpp.TABLES)
    for architecture, table in llama_cpp.TABLES.items():
        for _, stages in ((None, table.stages), *table.variants):
            names = ["input", *(stage for stage, _ in stages)]
            assert any(a == architecture and s == names for a, s, _ in cases.values()), (architecture, names)


def test_the_expectations_derived_from_the_family_files_are_the_written_out_ones():
    assert set(WRITTEN_OUT) <= set(CASES)
    for case, written in WRITTEN_OUT.items():
        assert expected(case) == written, case


def test_the_identities_a_layer_promises_are_the_stage_checks():
    """``promised_identities`` is what ``stage_check`` derives from the same stages (on random
    values, where every identity is judged)."""
    rows = np.random.default_rng(0).normal(size=(8, 16))
    for _, stages, _ in WRITTEN_OUT.values():
        for r in (1.0, 0.5):
            derived = {o.identity for o in stage_check.check_layer({s: rows for s in stages}, 0, r)}
            assert derived == promised_identities(stages, r), stages


@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_runs_the_node_table_and_the_stage_check_holds(case, ggufs, tmp_path):
    architecture, stages, identities = expected(case)
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
    routers = [e for e in events if e["event"] == "router"]
    assert [e["layer"] for e in routers] == ROUTED.get(case, [])
    assert all(t["margin"] >= 0 and len(t["experts"]) == e["top_k"] for e in routers for t in e["tokens"])
    report = stage_check.check_captured_trace(str(out))
    assert not report.failures, [str(f) for f in report.failures]
    assert {o.identity for o in report.checked} == identities
    assert report.largest_error() < 1e-4, report.largest()
