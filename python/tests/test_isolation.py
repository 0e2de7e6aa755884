"""Which layer is wrong: our Rust examples run with every layer fed the reference's captured
input (`MODEL_TRACE_ISOLATE`), against transformers on the same weights.

* SmolLM2 (Q4_1 port against transformers f32): the clean port's local error per layer stays
  within the port's stated tolerance (`--check-error-stat norm --rtol 0.1`); three porting
  bugs, each in one layer (a misread RMSNorm epsilon in layer 7, RoPE of another base in layer
  21, the MLP's gate and up swapped in layer 0), are named exactly, alone and all at once, where
  plain `diff` reports the first and the drift after it.
* MiniLM: isolation finds nothing on the clean port at the default tolerances; the attention
  scale wrong in layer 3 only is named at layer 3.
"""

import json

import pytest

from conftest import LONG_PROMPT as PROMPT, reference, run_example
from test_reference_diff import SMOLLM_TOLERANCE, diff

def local_layers(report, side="local"):
    """Layers whose own (or inherited) error leaves the tolerance."""
    return [row["layer"] for row in report["local_layers"] if row[side] and row[side]["ratio"] > 1]


# -- SmolLM2 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_reference(smollm_long_prompt):
    """The prompt pass of our SmolLM2 and transformers' on the same ids, both captured."""
    return smollm_long_prompt


def smollm_runs(directory, name, bugs=None):
    """The port plain and isolated, with `bugs` injected: the two trace files."""
    extra = ["--inject-bug", bugs] if bugs else []
    plain, isolated = directory / f"{name}.ndjson", directory / f"{name}-isolated.ndjson"
    args = ["--max-tokens", "1", *extra, "--capture", "pass=0", PROMPT]
    run_example("smollm", ["--trace-out", str(plain), *args], cwd=directory)
    run_example("smollm", ["--trace-out", str(isolated), *args], cwd=directory,
                env={"MODEL_TRACE_ISOLATE": str(directory / "ref.ndjson")})
    return plain, isolated


def test_smollm_clean_port_is_wrong_in_no_layer_on_its_own(smollm_reference):
    directory = smollm_reference
    plain, isolated = smollm_runs(directory, "clean")
    code, report = diff(directory / "ref.ndjson", plain, "--isolated", isolated, *SMOLLM_TOLERANCE)
    assert code == 0 and report["first_local_divergence"] is None, report["first_local_divergence"]
    rows = report["local_layers"]
    local = {row["layer"]: row["local"]["relative_error"] for row in rows}
    inherited = {row["layer"]: row["inherited"]["relative_error"] for row in rows}
    worst = max(local, key=local.get)
    # Isolation takes the inherited drift out: in most layers the local error is the smaller.
    smaller = sum(local[layer] <= inherited[layer] for layer in local)
    assert smaller >= 0.8 * len(local), (smaller, len(local))
    print(f"SmolLM2 isolated local error: largest {local[worst]:.4f} (layer {worst}); "
          f"inherited largest {max(inherited.values()):.4f}; local <= inherited in {smaller}/{len(local)} layers")
    print("local error per layer: " + json.dumps({k: round(v, 4) for k, v in local.items()}))


@pytest.mark.parametrize(
    "bugs, plain_first, buggy_layers",
    [
        ("rms-eps@7", 7, [7]),
        ("rope-base@21", 21, [21]),
        ("gate-up-swap@0", 0, [0]),
        ("rms-eps@7,rope-base@21,gate-up-swap@0", 0, [0, 7, 21]),
    ],
)
def test_smollm_isolation_names_exactly_the_buggy_layers(smollm_reference, bugs, plain_first, buggy_layers):
    directory = smollm_reference
    name = bugs.replace("@", "-").replace(",", "+")
    plain, isolated = smollm_runs(directory, name, bugs)
    code, report = diff(directory / "ref.ndjson", plain, "--isolated", isolated, *SMOLLM_TOLERANCE)
    assert code == 1
    assert report["first_divergence"]["layer"] == plain_first, report["first_divergence"]
    assert report["first_local_divergence"]["layer"] == buggy_layers[0]
    assert local_layers(report) == buggy_layers, report["local_layers"]
    if bugs.startswith("gate-up-swap"):
        # Plain diff: the first divergence, then drift through every layer after it.
        assert local_layers(report, "inherited") == list(range(31))


# -- MiniLM ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("isolation-minilm")
    reference("minilm_reference.py", "--out", directory / "ref.ndjson", "--capture", "*")
    return directory


def minilm_runs(directory, name, bugs=None):
    extra = ["--inject-bug", bugs] if bugs else []
    plain, isolated = directory / f"{name}.ndjson", directory / f"{name}-isolated.ndjson"
    run_example("minilm", ["--trace-out", str(plain), "--capture", "*", *extra], cwd=directory)
    run_example("minilm", ["--trace-out", str(isolated), "--capture", "*", *extra], cwd=directory,
                env={"MODEL_TRACE_ISOLATE": str(directory / "ref.ndjson")})
    return plain, isolated


def test_minilm_isolation_finds_nothing_on_the_clean_port_and_names_a_one_layer_bug(minilm_reference):
    directory = minilm_reference
    plain, isolated = minilm_runs(directory, "clean")
    code, report = diff(directory / "ref.ndjson", plain, "--isolated", isolated)
    assert code == 0 and report["first_local_divergence"] is None, report["first_local_divergence"]
    plain, isolated = minilm_runs(directory, "scale", "attention-scale@3")
    code, report = diff(directory / "ref.ndjson", plain, "--isolated", isolated)
    assert code == 1
    assert report["first_local_divergence"]["layer"] == 3, report["first_local_divergence"]
    assert local_layers(report) == [3], report["local_layers"]
