//! The filter syntax, checked on the cases that the Python side checks too
//! (`python/tests/test_filter_cases.py`): `tests/data/filter_cases.json` at the repository's
//! root. Only the public API: `TraceFilter`, `CaptureFilter` and `Tracepoint`.

use std::collections::BTreeMap;

use serde_json::Value;
use trace_runtime::{CaptureFilter, TraceFilter, Tracepoint, TracepointKind};

fn cases() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/filter_cases.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A string of the data, for a `&'static str` field of a `Tracepoint`.
fn leak(value: &Value) -> &'static str {
    Box::leak(string(value).to_owned().into_boxed_str())
}

fn string(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

fn list(value: &Value) -> &[Value] {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
}

fn tracepoints(cases: &Value) -> BTreeMap<String, Tracepoint> {
    let all = cases["tracepoints"].as_object().expect("tracepoints");
    all.iter()
        .map(|(id, fields)| {
            let kind = TracepointKind::from_name(string(&fields["kind"]))
                .unwrap_or_else(|| panic!("{id}: kind {}", fields["kind"]));
            let line = fields["line"].as_u64().expect("line");
            let tracepoint = Tracepoint {
                kind,
                name: leak(&fields["name"]),
                function: leak(&fields["function"]),
                module_path: leak(&fields["module"]),
                file: leak(&fields["file"]),
                line: u32::try_from(line).expect("line fits u32"),
            };
            (id.clone(), tracepoint)
        })
        .collect()
}

/// The ids of the case's list, sorted.
fn ids(value: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list(value).iter().map(|v| string(v).to_owned()).collect();
    ids.sort();
    ids
}

/// The ids of the tracepoints for which `test` holds, sorted.
fn which(all: &BTreeMap<String, Tracepoint>, test: impl Fn(&Tracepoint) -> bool) -> Vec<String> {
    all.iter()
        .filter(|(_, tp)| test(tp))
        .map(|(id, _)| id.clone())
        .collect()
}

fn index(value: &Value) -> Option<usize> {
    value
        .as_u64()
        .map(|n| usize::try_from(n).expect("index fits usize"))
}

#[test]
fn filters_admit_exclude_and_trace_passes_as_the_cases_say() {
    let cases = cases();
    let all = tracepoints(&cases);
    let listed: Vec<&Tracepoint> = all.values().collect();
    for case in list(&cases["filters"]) {
        let text = string(&case["filter"]);
        let filter = TraceFilter::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let admitted = which(&all, |tp| filter.admits(tp));
        assert_eq!(admitted, ids(&case["admitted"]), "admitted by {text:?}");
        if !case["excluded"].is_null() {
            let excluded = which(&all, |tp| filter.excludes(tp));
            assert_eq!(excluded, ids(&case["excluded"]), "excluded by {text:?}");
        }
        if !case["passes"].is_null() {
            let passes = which(&all, |tp| {
                tp.kind == TracepointKind::Model && filter.traces_pass(tp)
            });
            assert_eq!(passes, ids(&case["passes"]), "passes traced by {text:?}");
        }
        if !case["stages"].is_null() {
            for item in list(&case["stages"]) {
                let (stage, layer) = (&all[string(&item[0])], &all[string(&item[1])]);
                // The session's rule for a stage inside a layer (`TraceFilter`'s docs).
                let recorded =
                    filter.admits(stage) || filter.admits(layer) && !filter.excludes(stage);
                assert_eq!(Some(recorded), item[2].as_bool(), "{text:?}: {item}");
            }
        }
        if !case["unmatched"].is_null() {
            let expected: Vec<&str> = list(&case["unmatched"]).iter().map(string).collect();
            assert_eq!(filter.unmatched(&listed), expected, "unmatched in {text:?}");
        }
    }
}

/// The message names the pattern and says why.
fn assert_error(text: &str, error: &dyn std::fmt::Display, case: &Value) {
    let message = error.to_string();
    let prefix = format!(
        "invalid trace filter pattern `{}`: ",
        string(&case["pattern"])
    );
    assert!(message.starts_with(&prefix), "{text:?}: {message}");
    assert!(
        message.contains(string(&case["reason"])),
        "{text:?}: {message}"
    );
}

#[test]
fn bad_filters_are_errors_that_name_the_pattern() {
    let cases = cases();
    for case in list(&cases["filter_errors"]) {
        let text = string(&case["filter"]);
        match TraceFilter::parse(text) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(error) => assert_error(text, &error, case),
        }
    }
}

#[test]
fn captures_as_the_cases_say() {
    let cases = cases();
    let all = tracepoints(&cases);
    for case in list(&cases["captures"]) {
        let text = string(&case["filter"]);
        let capture = CaptureFilter::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        for item in list(&case["cases"]) {
            let tracepoint = &all[string(&item[0])];
            let captured = capture.captures(tracepoint, index(&item[1]), index(&item[2]));
            assert_eq!(Some(captured), item[3].as_bool(), "{text:?}: {item}");
        }
    }
}

#[test]
fn bad_capture_filters_are_errors_that_name_the_item() {
    let cases = cases();
    for case in list(&cases["capture_errors"]) {
        let text = string(&case["filter"]);
        match CaptureFilter::parse(text) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(error) => assert_error(text, &error, case),
        }
    }
}
