//! `diff` says at which pass two runs first choose different next tokens, and whether the other's
//! logit error explains it: a near-tie (the flip within what that error allows) or a
//! divergence (logits out of tolerance, or a flip far larger than their error), with the first
//! layer from which on the other's logit lens prefers its token.

mod common;

use std::path::Path;

use model_trace::{trace_logits_value, trace_model, ModelTracerConfig, Session, TensorRef};
use serde_json::Value;

use common::{run, scratch, text};

/// Logits over this many tokens: large enough that two swapped logits are a small part of the
/// whole tensor's error.
const VOCAB: usize = 4000;

/// Layers of the model: its final logits are layer 3's, its logit lens rows layers 0 to 2's.
const LAYERS: usize = 3;

/// A pass: consumes `ids`, records the logit lens rows `lens` (layers 0, 1, ...) and the final
/// logits.
#[trace_model(position = position, tokens = ids)]
fn forward(ids: &[u32], position: usize, lens: &[Vec<f32>], logits: &[f32]) {
    let shape = [VOCAB];
    for (layer, row) in lens.iter().enumerate() {
        trace_logits_value!(
            &TensorRef::new(row, &shape).expect("shape fits"),
            layer = layer
        );
    }
    trace_logits_value!(
        &TensorRef::new(logits, &shape).expect("shape fits"),
        layer = LAYERS
    );
}

/// Logits of `VOCAB` tokens around 2 (a pattern, so that sketches see no constant), with the
/// given tokens set.
fn logits(set: &[(u32, f32)]) -> Vec<f32> {
    let mut values: Vec<f32> = (0..VOCAB).map(|i| 2.0 + (i as f32 * 0.61).sin()).collect();
    for &(token, logit) in set {
        values[token as usize] = logit;
    }
    values
}

/// Each pass: the ids it consumes, its logit lens rows, its final logits.
type Pass = (Vec<u32>, Vec<Vec<f32>>, Vec<f32>);

fn write(path: &Path, passes: &[Pass]) -> String {
    let config = ModelTracerConfig {
        trace_logits: true,
        trace_activations: true,
        ..ModelTracerConfig::default()
    };
    let session = Session::builder(config)
        .trace_file(path)
        .start()
        .expect("the trace file can be created");
    for (position, (ids, lens, logits)) in passes.iter().enumerate() {
        forward(ids, position, lens, logits);
    }
    session.finish();
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The tolerance of every comparison here: norm criterion, rtol 10%.
const TOLERANCE: [&str; 4] = ["--check-error-stat", "norm", "--rtol", "0.1"];

/// `diff --json`: its exit code and output.
fn diff(reference: &str, other: &str) -> (Option<i32>, Value) {
    let output = run(&[&["diff", "--json"], &TOLERANCE[..], &[reference, other]].concat());
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

/// `diff`'s text.
fn diff_text(reference: &str, other: &str) -> String {
    text(&run(
        &[&["diff"], &TOLERANCE[..], &[reference, other]].concat()
    ))
}

/// The reference: token 10 wins at pass 1 over 11 by `margin`; every other pass, token 20.
fn reference_passes(margin: f32) -> Vec<Pass> {
    vec![
        (vec![1, 2, 3], vec![], logits(&[(20, 9.0)])),
        (vec![20], vec![], logits(&[(10, 6.0), (11, 6.0 - margin)])),
        (vec![10], vec![], logits(&[(20, 9.0)])),
    ]
}

/// `reference_passes(3.0)` with only the two tokens' logits swapped at pass 1, and the other's
/// token consumed next: 3.4% relative error over the tensor, within 10%, but a flip of 6 where
/// the RMS error per logit is 0.07.
fn swapped_passes() -> Vec<Pass> {
    vec![
        (vec![1, 2, 3], vec![], logits(&[(20, 9.0)])),
        (vec![20], vec![], logits(&[(10, 3.0), (11, 6.0)])),
        (vec![11], vec![], logits(&[(20, 9.0)])),
    ]
}

#[test]
fn a_flip_within_the_logit_error_is_a_near_tie() {
    let dir = scratch("first-token-near-tie");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(0.02));
    // The other: every logit a little off (0.5% RMS), and 11 ahead of 10 by 0.01.
    let noisy = |set: &[(u32, f32)]| -> Vec<f32> {
        let mut values = logits(set);
        for (i, v) in values.iter_mut().enumerate() {
            *v += 0.02 * (i as f32 * 1.7).cos();
        }
        for &(token, logit) in set {
            values[token as usize] = logit;
        }
        values
    };
    let other = write(
        &dir.join("other.ndjson"),
        &[
            (vec![1, 2, 3], vec![], noisy(&[(20, 9.0)])),
            (vec![20], vec![], noisy(&[(10, 5.995), (11, 6.005)])),
            (vec![11], vec![], noisy(&[(20, 9.0)])),
        ],
    );
    let (code, value) = diff(&reference, &other);
    let first = &value["first_token_divergence"];
    assert_eq!(first["pass"], 1, "{first:#}");
    assert_eq!(first["reference"]["token"], 10);
    assert_eq!(first["other"]["token"], 11);
    assert_eq!(first["parted"], true, "each consumed its own choice next");
    let margin = first["reference_margin"].as_f64().expect("a margin");
    assert!((margin - 0.02).abs() < 1e-4, "{margin}");
    let flip = first["flip"].as_f64().expect("both tokens in both rows");
    assert!((flip - 0.03).abs() < 1e-4, "{flip}");
    assert!(first["logits_error"]["within_tolerance"].as_bool().unwrap());
    assert!(
        flip <= first["near_tie_limit"].as_f64().unwrap(),
        "{first:#}"
    );
    assert_eq!(first["verdict"], "near_tie", "{first:#}");
    // Every logits tensor is within tolerance: the exit code is a clean diff's.
    assert_eq!(code, Some(0));
    let text = diff_text(&reference, &other);
    assert!(
        text.contains(
            "first token divergence: pass 1: the reference chose 10, the other 11, and each \
             went on with its own"
        ) && text.contains("verdict: near-tie"),
        "{text}"
    );
}

#[test]
fn a_flip_far_beyond_the_logit_error_is_a_divergence_even_within_tolerance() {
    let dir = scratch("first-token-large-flip");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(3.0));
    let other = write(&dir.join("other.ndjson"), &swapped_passes());
    let (_, value) = diff(&reference, &other);
    let first = &value["first_token_divergence"];
    assert_eq!(first["pass"], 1, "{first:#}");
    assert!(
        first["logits_error"]["within_tolerance"].as_bool().unwrap(),
        "{first:#}"
    );
    let flip = first["flip"].as_f64().unwrap();
    assert!((flip - 6.0).abs() < 1e-4, "{flip}");
    assert!(flip > first["near_tie_limit"].as_f64().unwrap());
    assert_eq!(first["verdict"], "divergence");
    let text = diff_text(&reference, &other);
    assert!(
        text.contains("verdict: divergence: the flip (6.000) is larger"),
        "{text}"
    );
}

#[test]
fn logits_out_of_tolerance_diverge_whatever_the_margin_and_the_lens_names_the_layer() {
    let dir = scratch("first-token-far-off");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(0.02));
    // The other's logits scaled by 1.5 (33% off), 11 first; its lens prefers 11 from layer 1
    // on (layer 0 prefers 10).
    let scaled = |set: &[(u32, f32)]| -> Vec<f32> { logits(set).iter().map(|v| v * 1.5).collect() };
    let lens = vec![
        logits(&[(10, 4.0), (11, 3.0)]),
        logits(&[(10, 3.0), (11, 4.0)]),
        logits(&[(10, 3.5), (11, 4.5)]),
    ];
    let other = write(
        &dir.join("other.ndjson"),
        &[
            (vec![1, 2, 3], vec![], logits(&[(20, 9.0)])),
            (vec![20], lens, scaled(&[(10, 6.0), (11, 6.2)])),
            (vec![11], vec![], logits(&[(20, 9.0)])),
        ],
    );
    let (code, value) = diff(&reference, &other);
    let first = &value["first_token_divergence"];
    assert_eq!(first["pass"], 1, "{first:#}");
    assert!(!first["logits_error"]["within_tolerance"].as_bool().unwrap());
    assert_eq!(first["verdict"], "divergence");
    assert_eq!(first["decisive_layer"], 1, "{first:#}");
    assert_eq!(code, Some(1), "the logits diverged");
    let text = diff_text(&reference, &other);
    assert!(
        text.contains("verdict: divergence: the other's logits are out of tolerance")
            && text.contains("the other's logit lens ranks 11 above 10 from layer 1 on"),
        "{text}"
    );
}

#[test]
fn runs_fed_the_same_tokens_say_which_would_have_chosen_otherwise() {
    let dir = scratch("first-token-teacher-forced");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(0.02));
    // The other prefers 11 at pass 1 but was fed the reference's 10 (`--tokens-from`).
    let other = write(
        &dir.join("other.ndjson"),
        &[
            (vec![1, 2, 3], vec![], logits(&[(20, 9.0)])),
            (vec![20], vec![], logits(&[(10, 5.99), (11, 6.0)])),
            (vec![10], vec![], logits(&[(20, 9.0)])),
        ],
    );
    let (_, value) = diff(&reference, &other);
    let first = &value["first_token_divergence"];
    assert_eq!(first["parted"], false, "{first:#}");
    assert_eq!(first["other"]["consumed_next"], 10);
    let text = diff_text(&reference, &other);
    assert!(
        text.contains(
            "pass 1: the reference chose 10, the other would have chosen 11 (both runs consumed \
             10 next)"
        ),
        "{text}"
    );
    // And the other way round: the reference was the one fed another token than its own.
    let (_, value) = diff(&other, &reference);
    let headline = diff_text(&other, &reference);
    assert_eq!(value["first_token_divergence"]["reference"]["token"], 11);
    assert!(
        headline.contains("the reference would have chosen 11, the other chose 10"),
        "{headline}"
    );
}

#[test]
fn the_same_choices_in_every_pass_are_said_and_null_in_json() {
    let dir = scratch("first-token-same");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(0.5));
    let other = write(&dir.join("other.ndjson"), &reference_passes(0.4));
    let (_, value) = diff(&reference, &other);
    assert!(value["first_token_divergence"].is_null(), "{value:#}");
    assert_eq!(value["token_passes_compared"], 3);
    let text = diff_text(&reference, &other);
    assert!(
        text.contains("same tokens: both runs chose the same next token in all 3 passes compared"),
        "{text}"
    );
}

#[test]
fn the_report_shows_the_first_token_divergence() {
    let dir = scratch("first-token-report");
    let reference = write(&dir.join("ref.ndjson"), &reference_passes(3.0));
    let other = write(&dir.join("other.ndjson"), &swapped_passes());
    let page = dir.join("report.html");
    let page_path = page.to_str().expect("a UTF-8 path");
    let output = run(&[
        &["report", &other, "--against", &reference],
        &TOLERANCE[..],
        &["-o", page_path],
    ]
    .concat());
    let html = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{e}: {}", text(&output)));
    let data = common::embedded_data(&html);
    let first = &data["diff"]["first_token"];
    assert_eq!(first["pass"], 1, "{first:#}");
    assert_eq!(first["verdict"], "divergence");
    assert_eq!(
        first["headline"],
        "pass 1: the reference chose 10, the other 11, and each went on with its own"
    );
}
