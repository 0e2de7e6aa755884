"""The filter syntax of the Rust runtime, checked on the cases that trace-runtime/tests/filter_cases.rs
checks against the Rust filters: tests/data/filter_cases.json."""

import json

import pytest

from model_trace.filter import CaptureFilter, FilterError, TraceFilter, Tracepoint, glob_match

from conftest import REPO

CASES = json.loads((REPO / "tests" / "data" / "filter_cases.json").read_text(encoding="utf-8"))
TRACEPOINTS = {key: Tracepoint(**fields) for key, fields in CASES["tracepoints"].items()}


def ids(cases):
    return [repr(case["filter"]) for case in cases]


@pytest.mark.parametrize("case", CASES["filters"], ids=ids(CASES["filters"]))
def test_filter(case):
    trace_filter = TraceFilter(case["filter"])
    admitted = sorted(key for key, tp in TRACEPOINTS.items() if trace_filter.admits(tp))
    assert admitted == sorted(case["admitted"])
    if "excluded" in case:
        excluded = sorted(key for key, tp in TRACEPOINTS.items() if trace_filter.excludes(tp))
        assert excluded == sorted(case["excluded"])
    if "passes" in case:
        passes = sorted(key for key, tp in TRACEPOINTS.items() if tp.kind == "model" and trace_filter.traces_pass(tp))
        assert passes == sorted(case["passes"])
    for stage, layer, recorded in case.get("stages", []):
        assert trace_filter.records_stage(TRACEPOINTS[stage], TRACEPOINTS[layer]) == recorded, (stage, layer)
    if "unmatched" in case:
        assert trace_filter.unmatched(list(TRACEPOINTS.values())) == case["unmatched"]


@pytest.mark.parametrize("case", CASES["filter_errors"], ids=ids(CASES["filter_errors"]))
def test_filter_error(case):
    with pytest.raises(FilterError) as error:
        TraceFilter(case["filter"])
    assert str(error.value).startswith(f"invalid trace filter pattern `{case['pattern']}`: "), str(error.value)
    assert case["reason"] in str(error.value)


@pytest.mark.parametrize("case", CASES["captures"], ids=ids(CASES["captures"]))
def test_capture(case):
    capture = CaptureFilter(case["filter"])
    for key, pass_index, layer, captured in case["cases"]:
        assert capture.captures(TRACEPOINTS[key], pass_index, layer) == captured, (key, pass_index, layer)


@pytest.mark.parametrize("case", CASES["capture_errors"], ids=ids(CASES["capture_errors"]))
def test_capture_error(case):
    with pytest.raises(FilterError) as error:
        CaptureFilter(case["filter"])
    assert str(error.value).startswith(f"invalid trace filter pattern `{case['pattern']}`: "), str(error.value)
    assert case["reason"] in str(error.value)


def test_glob_is_linear_enough_and_not_fnmatch():
    assert glob_match("*", "")
    assert not glob_match("?", "")
    assert glob_match("[ab]", "[ab]") and not glob_match("[ab]", "a")
    assert not glob_match("*a" * 20 + "b", "a" * 200)
