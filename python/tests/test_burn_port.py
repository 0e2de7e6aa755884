"""The burn MiniLM (``examples/minilm-burn``, burn 0.22 on its NdArray and Flex CPU backends)
against the same references as the candle MiniLM: transformers' BertModel traced by
model_trace.torch (``diff`` at the default tolerances, which the candle port meets), the candle
port itself, and its other backend. The candle port's porting bugs (``--inject-bug``) are
found the same way: where they were injected, by ``diff`` and by isolation. And the same model
on burn's wgpu backend (CubeCL kernels through wgpu, here on Mesa's lavapipe, a Vulkan driver
on the CPU), diffed against NdArray.
"""

import os

import pytest

from conftest import reference, run_example
from test_isolation import local_layers
from test_reference_diff import MINILM_BUGS, diff, first

#: The 6 layers' input, attn_out, resid_mid, mlp_out, output and attention probabilities.
TENSORS = 36


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """transformers' BertModel on the README's sentence, summarized and captured in full."""
    directory = tmp_path_factory.mktemp("minilm-burn")
    reference("minilm_reference.py", "--out", directory / "ref.ndjson")
    reference("minilm_reference.py", "--out", directory / "ref-captured.ndjson", "--capture", "*")
    return directory


def burn(directory, name, *args, backend="ndarray", env=None):
    out = directory / f"{name}.ndjson"
    run_example("minilm-burn", ["--device", backend, "--trace-out", str(out), *args], cwd=directory, env=env)
    return out


@pytest.mark.parametrize("backend", ["ndarray", "flex"])
def test_the_burn_port_matches_transformers_at_the_candle_ports_tolerances(references, backend):
    ours = burn(references, f"ours-{backend}", backend=backend)
    code, report = diff(references / "ref.ndjson", ours)
    assert code == 0, report["first_divergence"]
    counts = report["compared"]
    assert counts["matched"] == TENSORS and counts["close"] == TENSORS, counts
    assert not report["missing"] and not report["extra"]
    captured = burn(references, f"ours-{backend}-captured", "--capture", "*", backend=backend)
    code, report = diff(references / "ref-captured.ndjson", captured)
    assert code == 0, report["first_divergence"]
    worst = max(layer["worst"]["error"]["relative_error"] for layer in report["layers"])
    # What the candle port meets (test_reference_diff.py).
    assert worst < 1e-5, worst


def test_the_burn_port_matches_the_candle_port_and_its_backends_each_other(references):
    candle = references / "candle.ndjson"
    run_example("minilm", ["--trace-out", str(candle), "--capture", "*"], cwd=references)
    ndarray = burn(references, "ndarray-captured", "--capture", "*")
    flex = burn(references, "flex-captured", "--capture", "*", backend="flex")
    for reference_trace, other in [(candle, ndarray), (candle, flex), (ndarray, flex)]:
        code, report = diff(reference_trace, other)
        assert code == 0, (reference_trace.name, other.name, report["first_divergence"])
        assert report["compared"]["matched"] == TENSORS, report["compared"]
        assert report["first_divergence"] is None
        worst = max(layer["worst"]["error"]["relative_error"] for layer in report["layers"])
        assert worst < 1e-5, (reference_trace.name, other.name, worst)


@pytest.mark.parametrize("bug, where", MINILM_BUGS)
def test_the_candle_ports_bugs_are_found_where_injected_in_the_burn_port(references, bug, where):
    captured = burn(references, f"{bug}-captured", "--capture", "*", "--inject-bug", bug)
    code, report = diff(references / "ref-captured.ndjson", captured)
    assert (code, first(report)) == (1, where)
    assert report["first_divergence"]["method"] == "elementwise"
    summarized = burn(references, bug, "--inject-bug", bug)
    code, report = diff(references / "ref.ndjson", summarized)
    assert (code, first(report)) == (1, where)


def test_isolation_finds_nothing_on_the_clean_burn_port_and_names_a_one_layer_bug(references):
    isolate = {"MODEL_TRACE_ISOLATE": str(references / "ref-captured.ndjson")}
    for name, bugs, local in [("clean", None, []), ("scale", "attention-scale@3", [3])]:
        extra = ["--inject-bug", bugs] if bugs else []
        plain = burn(references, f"{name}-plain", "--capture", "*", *extra)
        isolated = burn(references, f"{name}-isolated", "--capture", "*", *extra, env=isolate)
        code, report = diff(references / "ref-captured.ndjson", plain, "--isolated", isolated)
        assert code == (1 if local else 0), report["first_local_divergence"]
        assert local_layers(report) == local, report["local_layers"]


def test_the_burn_port_on_wgpu_matches_ndarray_at_the_default_tolerances(references):
    """``--features wgpu`` (wgpu and CubeCL: minutes to build; ``scripts/test``'s test step builds
    it, ``cargo run`` here otherwise). Without an adapter (no GPU, no Mesa) it is skipped, unless
    MODEL_TRACE_REQUIRE_WGPU=1 (CI, which installs lavapipe)."""
    out = references / "wgpu-captured.ndjson"
    args = ["--device", "wgpu", "--trace-out", str(out), "--capture", "*"]
    result = run_example("minilm-burn", args, cwd=references, features="trace,wgpu", check=False)
    if result.returncode != 0:
        message = f"minilm-burn --device wgpu failed ({result.returncode}):\n{result.stderr[-3000:]}"
        if os.environ.get("MODEL_TRACE_REQUIRE_WGPU") == "1":
            pytest.fail(message)
        pytest.skip(f"no wgpu adapter here? {message}")
    adapter = next(line for line in result.stdout.splitlines() if line.startswith("backend: "))
    print(adapter)
    ndarray = burn(references, "ndarray-for-wgpu", "--capture", "*")
    code, report = diff(ndarray, out)
    assert code == 0, (adapter, report["first_divergence"])
    assert report["compared"]["matched"] == TENSORS, report["compared"]
    worst = max(layer["worst"]["error"]["relative_error"] for layer in report["layers"])
    assert worst < 1e-5, (adapter, worst)
    # and against transformers, as the CPU backends
    code, report = diff(references / "ref-captured.ndjson", out)
    assert code == 0, (adapter, report["first_divergence"])
