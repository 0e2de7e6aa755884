"""Golden traces from Python (``model_trace.testing``): a trace written by the Python writer
checked against its golden file (written when missing, not under CI; blessed on request;
bit-exact on the machine that blessed it, by statistics on another or within a tolerance), and
the golden file of a Rust trace of the README run, which must be the golden file that the Rust
crate's check of the same run committed."""

import subprocess

import numpy as np
import pytest

from conftest import REPO, model_trace_cli, run_example
from model_trace.testing import (
    CROSS_MACHINE_RTOL,
    GoldenMismatch,
    assert_matches_golden,
    golden_text,
    machine,
    read_golden,
)
from model_trace.writer import TraceWriter

LAYERS = 3
HIDDEN = 32


def write_trace(path, nudge=None, scale=None):
    """Two passes of a made-up 3-layer model; ``nudge = (pass, layer, stage)`` moves one value of
    that stage by one unit in the last place, ``scale`` the same way scales that stage by 1.01."""
    rng = np.random.default_rng(7)
    writer = TraceWriter(str(path))
    for pass_ in range(2):
        writer.begin_pass(position=pass_ * 4, tokens=[3 + pass_, 9])
        hidden = rng.standard_normal((2, HIDDEN)).astype(np.float32)
        for layer in range(LAYERS):
            writer.begin_layer(layer, "block", "tiny::Block::forward")
            writer.stage("input", hidden)
            for stage in ("attn_in", "mlp_out"):
                values = np.tanh(hidden * (layer + 1.5)).astype(np.float32)
                if nudge == (pass_, layer, stage):
                    values[0, 5] = np.nextafter(values[0, 5], np.float32(2))
                if scale == (pass_, layer, stage):
                    values = (values * np.float32(1.01)).astype(np.float32)
                writer.stage(stage, values)
                hidden = (hidden + values).astype(np.float32)
            writer.attention(np.full((1, 2, 2, 2), 0.5, np.float32), layer, "attention", "tiny::attention")
            writer.stage("output", hidden)
            writer.end_layer()
        writer.logits(hidden[-1] * 3, LAYERS, "head", "tiny::head")
        writer.end_pass()
    writer.close()
    return path


def check(trace, golden, **kwargs):
    """``assert_matches_golden`` neither blessing nor as under CI, whatever the environment."""
    return assert_matches_golden(trace, golden, bless=kwargs.pop("bless", False), ci=kwargs.pop("ci", False), **kwargs)


def test_a_missing_golden_file_is_written_and_fails_then_the_same_trace_passes_bit_exactly(tmp_path):
    trace, golden = write_trace(tmp_path / "run.ndjson"), tmp_path / "golden" / "run.ndjson"
    with pytest.raises(GoldenMismatch, match="did not exist: written now from this run; review it and commit it"):
        check(trace, golden)
    matched = check(trace, golden)
    # Per pass: 3 layers of input, attn_in, mlp_out, attention, output; the logits.
    assert (matched.tensors, matched.bit_identical) == (2 * (LAYERS * 5 + 1),) * 2
    assert matched.tolerance is None and not matched.blessed
    lines = golden.read_text().splitlines()
    assert lines[0] == f'{{"format":"model-trace-golden","version":1,"machine":"{machine()}"}}'
    assert lines[1] == '{"pass":0,"position":0,"tokens":[3,9]}'
    assert lines[2].startswith('{"pass":0,"layer":0,"tensors":[["input",[2,32],"')
    assert len(lines) == 1 + 2 * (1 + LAYERS + 1)


def test_under_ci_a_missing_golden_file_fails_without_being_written(tmp_path):
    trace, golden = write_trace(tmp_path / "run.ndjson"), tmp_path / "run.golden.ndjson"
    with pytest.raises(GoldenMismatch, match="MODEL_TRACE_BLESS=1"):
        check(trace, golden, ci=True)
    assert not golden.exists()


def test_one_value_one_ulp_off_is_named_bit_exact_and_passes_within_a_tolerance(tmp_path):
    golden = tmp_path / "run.golden.ndjson"
    check(write_trace(tmp_path / "run.ndjson"), golden, bless=True)
    nudged = write_trace(tmp_path / "nudged.ndjson", nudge=(1, 2, "attn_in"))
    with pytest.raises(GoldenMismatch) as failure:
        check(nudged, golden)
    message = str(failure.value)
    assert "first difference: pass 1, layer 2, attn_in: other bits (its fingerprint changed)" in message
    new = tmp_path / "run.golden.new.ndjson"
    assert new.exists() and f"model-trace diff --atol 0 --rtol 0 {golden} {new}" in message
    matched = check(nudged, golden, rtol=1e-5)
    assert matched.bit_identical < matched.tensors and matched.tolerance == (1e-5, 1e-5)
    assert not new.exists(), "a passing check removes the failed one's file"


def test_a_one_percent_error_fails_a_tolerant_check_with_its_ratio(tmp_path):
    golden = tmp_path / "run.golden.ndjson"
    check(write_trace(tmp_path / "run.ndjson"), golden, bless=True)
    scaled = write_trace(tmp_path / "scaled.ndjson", scale=(0, 1, "mlp_out"))
    with pytest.raises(GoldenMismatch, match=r"first difference: pass 0, layer 1, mlp_out: \w+ .* became .*× the allowance"):
        check(scaled, golden, rtol=1e-3)


def test_on_another_machine_the_statistics_decide_within_the_stated_tolerance(tmp_path):
    golden = tmp_path / "run.golden.ndjson"
    check(write_trace(tmp_path / "run.ndjson"), golden, bless=True)
    header, rest = golden.read_text().split("\n", 1)
    golden.write_text(header.replace(f'"machine":"{machine()}"', '"machine":"riscv64 v"') + "\n" + rest)
    matched = check(write_trace(tmp_path / "nudged.ndjson", nudge=(0, 0, "mlp_out")), golden)
    assert matched.tolerance == (CROSS_MACHINE_RTOL, 1e-5) and matched.other_machine == "riscv64 v"
    with pytest.raises(GoldenMismatch, match=r"blessed on another machine \(riscv64 v\)"):
        check(write_trace(tmp_path / "scaled.ndjson", scale=(1, 0, "attn_in")), golden)


def test_the_rust_golden_check_and_this_one_write_the_same_golden_file_for_the_readme_run(tmp_path):
    """The README run (4 tokens) traced by the Rust example, as a golden file: on the machine
    that blessed the committed one, byte for byte what the Rust check wrote; elsewhere, within
    the cross-machine tolerance of it. Either way ``model-trace diff`` finds them alike."""
    trace = tmp_path / "smollm.ndjson"
    run_example("smollm", ["--max-tokens", "4", "--trace-out", str(trace), "The capital of France is"], cwd=tmp_path)
    committed = REPO / "examples" / "smollm" / "tests" / "golden" / "smollm-paris.ndjson"
    header, tensors = read_golden(committed.read_text())
    ours = golden_text(trace)
    assert len(read_golden(ours)[1]) == len(tensors) == 964
    if header["machine"] == machine():
        assert ours == committed.read_text()
    copy = tmp_path / "smollm-paris.ndjson"
    copy.write_text(committed.read_text())
    matched = check(trace, copy)
    assert matched.tensors == 964
    mine = tmp_path / "mine.ndjson"
    mine.write_text(ours)
    result = subprocess.run(model_trace_cli("diff", copy, mine),
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "964 tensors" in result.stdout, result.stdout
    listed = subprocess.run(model_trace_cli("list", copy),
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert listed.returncode == 0, listed.stderr
    assert "golden file, version 1" in listed.stdout and f'made on "{header["machine"]}"' in listed.stdout, listed.stdout
