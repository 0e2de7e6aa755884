//! The router record on the cases that the Python writers compute too:
//! `tests/data/router_cases.json` at the repository's root, inputs and the records expected
//! from them. `ROUTER_CASES=write` rewrites the records from what this build computes (review
//! the diff: the margins' meaning is the contract). Cost: milliseconds.

use serde_json::{json, Value};
use trace_runtime::{expert_load, ExpertGroups, RoutedToken, RouterScoring, RoutingRule};

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/data/router_cases.json"
);

/// A float as the trace file writes it: a number, or `"NaN"`, `"inf"`, `"-inf"`.
fn float(value: &Value) -> f32 {
    match value {
        Value::Number(number) => number.as_f64().expect("a number") as f32,
        Value::String(text) => match text.as_str() {
            "NaN" => f32::NAN,
            "inf" => f32::INFINITY,
            "-inf" => f32::NEG_INFINITY,
            other => panic!("not a float: {other:?}"),
        },
        other => panic!("not a float: {other}"),
    }
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(float)
        .collect()
}

fn rows(value: &Value) -> Vec<&Value> {
    value.as_array().expect("rows").iter().collect()
}

/// The records of one case's inputs, as the trace file writes them.
fn records(case: &Value) -> (Value, Value) {
    let scoring: RouterScoring =
        serde_json::from_value(case["scoring"].clone()).expect("a scoring");
    let groups: Option<ExpertGroups> =
        serde_json::from_value(case["groups"].clone()).expect("groups or null");
    let bias = (!case["bias"].is_null()).then(|| floats(&case["bias"]));
    let rule = RoutingRule {
        scoring,
        bias: bias.as_deref(),
        groups,
    };
    let logits: Vec<Vec<f32>> = rows(&case["logits"]).into_iter().map(floats).collect();
    let num_experts = logits[0].len();
    rule.check(num_experts).expect("a rule that routes");
    let experts: Vec<Vec<u32>> =
        serde_json::from_value(case["experts"].clone()).expect("expert ids");
    let weights: Vec<Vec<f32>> = rows(&case["weights"]).into_iter().map(floats).collect();
    let tokens: Vec<RoutedToken> = (0..logits.len())
        .map(|row| {
            RoutedToken::from_routing(&rule, row, &logits[row], &experts[row], &weights[row])
        })
        .collect();
    let load = expert_load(num_experts, &experts.concat());
    (as_written(&tokens), json!(load))
}

/// `value` as a trace file writes it (each float the shortest decimal of its `f32`), read back.
fn as_written(value: &impl serde::Serialize) -> Value {
    let text = serde_json::to_string(value).expect("serializes");
    serde_json::from_str(&text).expect("reads back")
}

#[test]
fn every_case_gives_the_records_of_the_file() {
    let text = std::fs::read_to_string(PATH).unwrap_or_else(|e| panic!("{PATH}: {e}"));
    let mut data: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{PATH}: {e}"));
    let write = std::env::var("ROUTER_CASES").is_ok_and(|v| v == "write");
    let cases = data["cases"].as_array_mut().expect("cases");
    assert!(cases.len() >= 5, "a handful of cases");
    for case in cases.iter_mut() {
        let (tokens, load) = records(case);
        if write {
            case["tokens"] = tokens;
            case["load"] = load;
            continue;
        }
        let name = &case["name"];
        assert_eq!(case["tokens"], tokens, "case {name}: tokens");
        assert_eq!(case["load"], load, "case {name}: load");
    }
    if write {
        let text = serde_json::to_string_pretty(&data).expect("serializes") + "\n";
        std::fs::write(PATH, text).unwrap_or_else(|e| panic!("{PATH}: {e}"));
    }
}
