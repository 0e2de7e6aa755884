"""The router record computed in Python (model_trace.routing) and written as a ``router`` event
(TraceWriter.router): the same cases as the Rust recorder's unit tests
(trace-runtime/src/record/routing.rs), each value checked against its definition, and the Rust
recorder's own outputs (tests/data/router_cases.json) reproduced. Pure numpy: well under a
second."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from model_trace.format import read_trace
from model_trace.routing import RoutingError, routed_token, routing_record, selection_scores
from model_trace.writer import TraceWriter


def f32(x):
    return float(np.float32(x))


def softmax(logits):
    return selection_scores(logits, "softmax", None)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def token(logits, experts, scoring="softmax", bias=None, groups=None):
    logits = [f32(l) for l in logits]
    return routed_token(0, logits, experts, [0.5] * len(experts), scoring, bias, groups)


def test_softmax_without_bias_gives_the_half_logit_gap():
    logits = [2.0, 1.0, 0.5, -1.0]
    t = token(logits, [0, 1])
    p = softmax(logits)
    assert t["runner_up"] == 2
    assert t["margin"] == f32(p[1] - p[2])
    assert t["logit_margin"] == 0.25
    assert t["logits"] == [2.0, 1.0, 0.5]
    assert "group_margin" not in t
    swapped = token(logits, [1, 0])
    assert (swapped["margin"], swapped["logit_margin"]) == (t["margin"], t["logit_margin"])
    assert swapped["logits"] == [1.0, 2.0, 0.5]


def test_experts_that_are_not_the_top_k_give_a_negative_margin_and_no_logit_margin():
    logits = [2.0, 1.0, 0.5, -1.0]
    t = token(logits, [0, 3])
    p = softmax(logits)
    assert t["runner_up"] == 1
    assert t["margin"] == f32(p[3] - p[1]) < 0
    assert t["logit_margin"] == 0.0


def test_nan_logits_give_nan_margins():
    t = token([2.0, math.nan, 0.5, -1.0], [0, 2])
    assert math.isnan(t["margin"]) and math.isnan(t["logit_margin"])
    # a NaN that is neither chosen nor the runner-up leaves a sigmoid router's margin
    t = token([2.0, 1.0, 0.5, math.nan], [0, 1], "sigmoid")
    assert (t["runner_up"], t["logit_margin"]) == (2, 0.25)
    t = token([2.0, math.nan, 0.5, -1.0], [0, 1], "sigmoid")
    assert math.isnan(t["margin"]) and math.isnan(t["logit_margin"])


def test_choosing_every_expert_leaves_nothing_to_change():
    t = token([0.1, 0.2, 0.3], [2, 1, 0])
    assert t["runner_up"] is None
    assert t["margin"] == t["logit_margin"] == math.inf
    assert t["logits"] == [f32(0.3), f32(0.2), f32(0.1)]


def test_sigmoid_with_bias_chooses_by_the_biased_score_and_solves_the_crossing():
    logits, bias = [1.0, 0.8, 0.6, -2.0], [0.0, f32(-0.3), f32(0.2), 0.0]
    t = token(logits, [2, 0], "sigmoid", bias)
    s = lambda l, b: sigmoid(f32(l)) + b  # noqa: E731
    assert t["runner_up"] == 1
    assert t["margin"] == f32(s(1.0, 0.0) - s(0.8, bias[1]))
    delta = t["logit_margin"]
    gap = s(f32(1.0 - delta), 0.0) - s(f32(0.8 + delta), bias[1])
    assert abs(gap) < 1e-6, (gap, delta)
    assert delta > 0.1  # the bias favours the chosen expert: wider than the unbiased half gap
    unbiased = token(logits, [0, 1], "sigmoid")
    assert (unbiased["runner_up"], unbiased["logit_margin"]) == (2, f32((f32(0.8) - f32(0.6)) / 2))


def test_softmax_with_bias_crosses_at_the_logit_margin_and_not_before():
    logits = [f32(x) for x in (1.5, 0.9, 0.7, 0.2, -0.4)]
    bias = [0.0, f32(0.1), f32(0.05), 0.0, 0.0]
    t = token(logits, [0, 1], "softmax", bias)
    assert t["runner_up"] == 2 and t["margin"] > 0 and t["logit_margin"] > 0

    def margin_at(delta):
        margins = []
        for others in (delta, -delta):
            moved = [l - delta if e == 1 else l + delta if e == 2 else l + others for e, l in enumerate(logits)]
            margins.append(token(moved, [0, 1], "softmax", bias)["margin"])
        return min(margins)

    assert margin_at(t["logit_margin"] * 0.999) > 0
    assert margin_at(t["logit_margin"] * 1.001) < 0


GROUPED_LOGITS = [f32(x) for x in (2.0, 1.5, 0.5, -2.0, 1.8, -0.5, 2.6, -1.0)]


def test_grouped_top_k_finds_the_runner_up_in_the_chosen_groups_only():
    s = lambda e: sigmoid(GROUPED_LOGITS[e])  # noqa: E731
    group = [s(0) + s(1), s(2) + s(3), s(4) + s(5), s(6) + s(7)]
    assert group[0] > group[2] > group[3] > group[1]
    t = token(GROUPED_LOGITS, [0, 4], "sigmoid", [0.0] * 8, (4, 2))
    assert t["runner_up"] == 1  # expert 6 scores best of all, but its group was not chosen
    assert t["margin"] == f32(s(4) - s(1))
    assert t["group_margin"] == f32(group[2] - group[3])
    delta = t["logit_margin"]
    moved = lambda e, by: sigmoid(GROUPED_LOGITS[e] + by)  # noqa: E731
    assert abs(moved(4, -delta) + moved(5, -delta) - moved(6, delta) - moved(7, delta)) < 1e-6
    assert delta < 0.1  # the group pair decides here


def test_a_chosen_expert_outside_the_best_groups_gives_a_negative_group_margin():
    t = token(GROUPED_LOGITS, [0, 2], "sigmoid", [0.0] * 8, (4, 2))
    assert t["group_margin"] < 0 and t["logit_margin"] == 0.0
    t = token(GROUPED_LOGITS, [6, 0], "sigmoid", [0.0] * 8, (4, 4))
    assert ("group_margin" in t, t["runner_up"]) == (False, 4)
    assert abs(t["logit_margin"] - 0.1) < 1e-6


def test_grouped_softmax_crosses_at_the_logit_margin():
    t = token([2.0, 1.0, 0.3, 0.2, 1.6, 1.4, 0.1, 0.0], [0, 4], groups=(4, 2))
    assert t["runner_up"] == 5 and t["group_margin"] > 0
    assert t["logit_margin"] == f32((f32(1.6) - f32(1.4)) / 2)


def test_a_call_reads_batch_major_rows_and_counts_the_load():
    logits = np.array([[[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]]], dtype=np.float32)  # [1, 2, 4]
    record = routing_record(logits, np.array([[[0, 1], [1, 3]]]), np.array([[[0.6, 0.4], [0.7, 0.3]]]))
    assert (record["num_experts"], record["top_k"], record["load"]) == (4, 2, [1, 2, 0, 1])
    assert [t["row"] for t in record["tokens"]] == [0, 1]
    assert record["tokens"][1]["runner_up"] == 2 and record["tokens"][1]["logit_margin"] == 0.5


@pytest.mark.parametrize("change, message", [
    (dict(experts=[[0, 4]]), "chose expert 4 of 4"),
    (dict(experts=[[2, 2]]), "row 0 chooses expert 2 twice"),
    (dict(weights=[[0.5, 0.5], [0.5, 0.5]]), "1 rows, its experts 1 and its weights 2"),
    (dict(bias=[0.0] * 3), "3 values for 4 experts"),
    (dict(groups=(3, 1)), "do not split"),
    (dict(groups=(2, 3)), "must be 1 to 2"),
    (dict(scoring="relu"), "not 'relu'"),
])
def test_values_that_do_not_fit_together_say_why(change, message):
    arguments = dict(logits=[[2.0, 1.0, 0.5, -1.0]], experts=[[0, 1]], weights=[[0.5, 0.5]])
    arguments.update(change)
    with pytest.raises(RoutingError, match=message):
        routing_record(**arguments)


def test_the_writer_writes_the_router_event_of_the_format(tmp_path):
    path = str(tmp_path / "router.ndjson")
    writer = TraceWriter(path)
    writer.begin_pass(position=0, tokens=[5, 6])
    logits = np.array([[2.0, 1.0, 0.5, -1.0, 0.0, 0.1, 0.2, 0.3], [0.5, 2.0, 1.0, -1.0, 3.0, 0.1, 0.2, 0.3]],
                      dtype=np.float32)
    writer.router(logits, [[0, 1], [4, 1]], [[1.5, 1.0], [1.4, 1.1]], layer=3, tracepoint="gate",
                  function="Gate.forward", scoring="sigmoid", bias=np.zeros(8, dtype=np.float32), groups=(4, 2))
    writer.end_pass()
    writer.close()
    header, events = read_trace(path)
    (event,) = [e for e in events if e["event"] == "router"]
    assert header["schema"] == 3
    assert list(event) == ["event", "seq", "pass", "layer", "tracepoint", "function", "scoring", "groups",
                           "selection_bias", "num_experts", "top_k", "logits", "tokens", "load"]
    assert (event["pass"], event["layer"], event["scoring"], event["groups"], event["selection_bias"]) == (
        0, 3, "sigmoid", {"groups": 4, "top_groups": 2}, True)
    assert event["logits"]["shape"] == [2, 8] and event["logits"]["stats"]["max"] == 3.0
    assert event["load"] == [1, 2, 0, 0, 1, 0, 0, 0]
    expected = routing_record(logits, [[0, 1], [4, 1]], [[1.5, 1.0], [1.4, 1.1]], "sigmoid", np.zeros(8), (4, 2))
    def as_f32(token):  # the event's floats are float32 texts; the computed ones float64 holding float32
        return {key: [f32(v) for v in value] if isinstance(value, list) else f32(value) if isinstance(value, float)
                else value for key, value in token.items()}

    assert [as_f32(t) for t in event["tokens"]] == [as_f32(t) for t in expected["tokens"]]
    assert event["tokens"][0]["weights"] == [1.5, 1.0]


#: The Rust recorder's cases: inputs and the record trace_runtime::RoutedToken::from_routing
#: computes from them (trace-runtime/tests/router_cases.rs writes and checks them).
RUST_CASES = Path(__file__).resolve().parents[2] / "tests" / "data" / "router_cases.json"


def read_float(value):
    return {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf}.get(value, value) if isinstance(value, str) else value


def floats(values):
    return np.array([[read_float(v) for v in row] for row in values], dtype=np.float32)


def same_f32(ours, theirs, ulps):
    """Equal as float32 (NaN to NaN), or within ``ulps`` float32 steps."""
    a, b = np.float32(ours), np.float32(read_float(theirs))
    if np.isnan(a) or np.isnan(b) or np.isinf(a) or np.isinf(b):
        return (np.isnan(a) and np.isnan(b)) or a == b
    return abs(int(a.view(np.int32)) - int(b.view(np.int32))) <= ulps if np.sign(a) == np.sign(b) else a == b


def test_python_computes_the_rust_recorders_cases():
    """Every case of the Rust recorder's file: the same runner-up, margins, logits and load;
    floats equal as float32, but ``logit_margin`` found by bisection (a bias or groups), which
    may end a few float32 steps apart (the file's own note)."""
    cases = json.loads(RUST_CASES.read_text(encoding="utf-8"))["cases"]
    assert cases
    for case in cases:
        groups = case["groups"]
        bias = None if case["bias"] is None else [read_float(b) for b in case["bias"]]
        record = routing_record(floats(case["logits"]), np.array(case["experts"]), floats(case["weights"]),
                                case["scoring"], bias, None if groups is None else (groups["groups"], groups["top_groups"]))
        assert record["load"] == case["load"], case["about"]
        bisected = bias is not None or groups is not None
        for ours, theirs in zip(record["tokens"], case["tokens"], strict=True):
            where = f"{case['about']}, row {theirs['row']}"
            assert set(ours) == set(theirs), where
            assert (ours["row"], ours["experts"], ours["runner_up"]) == (theirs["row"], theirs["experts"],
                                                                         theirs["runner_up"]), where
            for key in ("weights", "logits"):
                assert all(same_f32(a, b, 0) for a, b in zip(ours[key], theirs[key], strict=True)), (where, key)
            for key in ("margin", "group_margin"):
                if key in theirs:
                    assert same_f32(ours[key], theirs[key], 0), (where, key, ours[key], theirs[key])
            assert same_f32(ours["logit_margin"], theirs["logit_margin"], 4 if bisected else 0), (
                where, ours["logit_margin"], theirs["logit_margin"])
