use std::borrow::Cow;
use std::collections::HashMap;

use super::*;
use crate::summary::{CaptureRef, TensorSummary};

const CHANNELS: usize = 16;

/// Rows of a deterministic signal whose rows have different scales, as a residual stream's do.
fn signal(rows: usize, seed: f32) -> Vec<f32> {
    (0..rows * CHANNELS)
        .map(|i| {
            let row = (i / CHANNELS) as f32;
            ((i as f32 + seed) * 0.7311).sin() * (1.0 + row * 0.3) + seed * 0.01
        })
        .collect()
}

fn add(a: &[f32], b: &[f32], r: f32) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + r * y).collect()
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    x.chunks(CHANNELS)
        .flat_map(|row| {
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / CHANNELS as f32).sqrt();
            row.iter()
                .enumerate()
                .map(move |(c, v)| v / rms * (0.5 + c as f32 * 0.1))
        })
        .collect()
}

fn layer_norm(x: &[f32]) -> Vec<f32> {
    x.chunks(CHANNELS)
        .flat_map(|row| {
            let n = CHANNELS as f32;
            let mean = row.iter().sum::<f32>() / n;
            let std = (row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n).sqrt();
            row.iter().map(move |v| (v - mean) / std * 1.5 + 0.1)
        })
        .collect()
}

/// A layer of `stages` (name, values), each `[rows, CHANNELS]`, captured when `captured`.
fn layer(stages: &[(&'static str, Vec<f32>)], captured: bool) -> LayerEvent {
    LayerEvent {
        seq: 0,
        pass: 0,
        layer: 3,
        tracepoint: Cow::Borrowed("block"),
        function: Cow::Borrowed("block"),
        start_ns: 0,
        duration_ns: 0,
        stages: stages
            .iter()
            .enumerate()
            .map(|(seq, (name, values))| {
                let shape = vec![1, values.len() / CHANNELS, CHANNELS];
                let mut tensor = TensorSummary::of_values(shape, "f32", values);
                if captured {
                    tensor.capture = Some(CaptureRef {
                        file: "f".to_owned(),
                        tensor: (*name).to_owned(),
                    });
                }
                StageEvent {
                    seq: seq as u64,
                    name: Cow::Borrowed(name),
                    tensor,
                }
            })
            .collect(),
        residual_ratio: None,
    }
}

/// Checks `layer` with its stages' values as captures.
fn check(layer: &LayerEvent, stages: &[(&'static str, Vec<f32>)], r: f64) -> LayerCheck {
    let values: HashMap<&str, &Vec<f32>> = stages.iter().map(|(n, v)| (*n, v)).collect();
    check_layer(layer, r, |stage| {
        values.get(stage.name.as_ref()).map(|v| (*v).clone())
    })
}

fn outcomes(check: &LayerCheck) -> Vec<(IdentityKind, Outcome)> {
    check
        .results
        .iter()
        .map(|r| (r.identity.kind, r.outcome))
        .collect()
}

/// A pre-norm (Llama) block's stages.
fn pre_norm(rows: usize) -> Vec<(&'static str, Vec<f32>)> {
    let input = signal(rows, 1.0);
    let attn_in = rms_norm(&input);
    let attn_out = signal(rows, 2.0);
    let resid_mid = add(&input, &attn_out, 1.0);
    let mlp_in = rms_norm(&resid_mid);
    let mlp_out = signal(rows, 3.0);
    let output = add(&resid_mid, &mlp_out, 1.0);
    vec![
        ("input", input),
        ("attn_in", attn_in),
        ("attn_out", attn_out),
        ("resid_mid", resid_mid),
        ("mlp_in", mlp_in),
        ("mlp_out", mlp_out),
        ("output", output),
    ]
}

#[test]
fn a_pre_norm_block_passes_from_values_and_from_sketches() {
    use IdentityKind::*;
    let stages = pre_norm(6);
    let by_values = check(&layer(&stages, true), &stages, 1.0);
    assert_eq!(
        outcomes(&by_values),
        [
            (ResidMid, Outcome::Passed),
            (Output, Outcome::Passed),
            (AttnIn, Outcome::Passed),
            (MlpIn, Outcome::Passed)
        ]
    );
    assert!(by_values
        .results
        .iter()
        .all(|r| r.method == Some(Method::Values) && r.error.unwrap() < 1e-5));
    let by_sketch = check(&layer(&stages, false), &stages, 1.0);
    assert_eq!(
        outcomes(&by_sketch),
        [
            (ResidMid, Outcome::Passed),
            (Output, Outcome::Passed),
            (AttnIn, Outcome::Skipped(Skip::NeedsCaptures)),
            (MlpIn, Outcome::Skipped(Skip::NeedsCaptures))
        ]
    );
    assert_eq!(by_sketch.results[0].method, Some(Method::Sketch));
    assert_eq!(
        by_sketch.results[0].identity.to_string(),
        "resid_mid = input + attn_out"
    );
}

#[test]
fn swapped_stages_fail_naming_the_identity() {
    let mut stages = pre_norm(6);
    // resid_mid recorded where mlp_in is, and the reverse.
    let (resid, mlp_in) = (stages[3].1.clone(), stages[4].1.clone());
    stages[3].1 = mlp_in;
    stages[4].1 = resid;
    for captured in [true, false] {
        let checked = check(&layer(&stages, captured), &stages, 1.0);
        assert!(checked.failed());
        let first = checked
            .results
            .iter()
            .find(|r| r.outcome == Outcome::Failed)
            .unwrap();
        assert_eq!(first.identity.kind, IdentityKind::ResidMid);
        assert!(first.error.unwrap() > 0.1, "{first:?}");
    }
}

#[test]
fn a_norm_stage_that_is_no_norm_of_its_predecessor_fails_on_values() {
    let mut stages = pre_norm(6);
    stages[1].1 = rms_norm(&signal(6, 9.0));
    let checked = check(&layer(&stages, true), &stages, 1.0);
    let n1 = &checked.results[2];
    assert_eq!(
        (n1.identity.kind, n1.outcome),
        (IdentityKind::AttnIn, Outcome::Failed)
    );
    assert_eq!(n1.identity.to_string(), "attn_in ≈ norm(input)");
}

#[test]
fn a_decode_step_skips_the_norms() {
    let stages = pre_norm(1);
    let checked = check(&layer(&stages, true), &stages, 1.0);
    assert_eq!(checked.results[2].outcome, Outcome::Skipped(Skip::FewRows));
    assert_eq!(checked.results[3].outcome, Outcome::Skipped(Skip::FewRows));
    assert_eq!(checked.results[0].outcome, Outcome::Passed);
}

#[test]
fn sandwich_norms_are_what_joins_the_stream() {
    let rows = 5;
    let input = signal(rows, 1.0);
    let attn_in = rms_norm(&input);
    let attn_out = signal(rows, 2.0);
    let attn_post_norm = rms_norm(&attn_out);
    let resid_mid = add(&input, &attn_post_norm, 1.0);
    let mlp_in = rms_norm(&resid_mid);
    let mlp_out = signal(rows, 3.0);
    let mlp_post_norm = rms_norm(&mlp_out);
    let output = add(&resid_mid, &mlp_post_norm, 1.0);
    let stages = vec![
        ("input", input),
        ("attn_in", attn_in),
        ("attn_out", attn_out),
        ("attn_post_norm", attn_post_norm),
        ("resid_mid", resid_mid),
        ("mlp_in", mlp_in),
        ("mlp_out", mlp_out),
        ("mlp_post_norm", mlp_post_norm),
        ("output", output),
    ];
    let checked = check(&layer(&stages, true), &stages, 1.0);
    assert_eq!(checked.results.len(), 6);
    assert!(checked.results.iter().all(|r| r.outcome == Outcome::Passed));
    assert_eq!(
        checked.results[0].identity.to_string(),
        "resid_mid = input + attn_post_norm"
    );
    assert_eq!(
        checked.results[5].identity.to_string(),
        "mlp_post_norm ≈ norm(mlp_out)"
    );
}

#[test]
fn a_post_norm_block_passes_in_the_normalised_form_on_values_only() {
    let rows = 7;
    let input = signal(rows, 1.0);
    let attn_out = signal(rows, 2.0);
    let resid_mid = layer_norm(&add(&input, &attn_out, 1.0));
    let mlp_out = signal(rows, 3.0);
    let output = layer_norm(&add(&resid_mid, &mlp_out, 1.0));
    let stages = vec![
        ("input", input),
        ("attn_out", attn_out),
        ("resid_mid", resid_mid),
        ("mlp_out", mlp_out),
        ("output", output),
    ];
    let checked = check(&layer(&stages, true), &stages, 1.0);
    for result in &checked.results {
        assert_eq!(result.outcome, Outcome::Passed, "{result:?}");
        assert!(result.is_normalised());
    }
    assert_eq!(
        checked.results[0].describe(),
        "resid_mid ≈ norm(input + attn_out)"
    );
    let summaries = check(&layer(&stages, false), &stages, 1.0);
    for result in &summaries.results {
        assert_eq!(result.outcome, Outcome::Skipped(Skip::NeedsCaptures));
    }
    // A pre-norm block is never judged in that form.
    let mut with_norm = stages.clone();
    with_norm.insert(1, ("attn_in", rms_norm(&stages[0].1)));
    let checked = check(&layer(&with_norm, true), &with_norm, 1.0);
    assert_eq!(checked.results[0].outcome, Outcome::Failed);
    assert_eq!(checked.results[0].normalised_error, None);
}

#[test]
fn a_parallel_block_and_a_residual_multiplier() {
    let rows = 4;
    let r = 0.25f32;
    let input = signal(rows, 1.0);
    let attn_in = layer_norm(&input);
    let mlp_in = rms_norm(&input);
    let attn_out = signal(rows, 2.0);
    let mlp_out = signal(rows, 3.0);
    let output = add(&add(&input, &attn_out, r), &mlp_out, r);
    let stages = vec![
        ("input", input),
        ("attn_in", attn_in),
        ("attn_out", attn_out),
        ("mlp_in", mlp_in),
        ("mlp_out", mlp_out),
        ("output", output),
    ];
    let checked = check(&layer(&stages, true), &stages, f64::from(r));
    assert_eq!(
        outcomes(&checked),
        [
            (IdentityKind::Parallel, Outcome::Passed),
            (IdentityKind::AttnIn, Outcome::Passed),
            (IdentityKind::MlpIn, Outcome::Passed)
        ]
    );
    assert!(checked.results[0]
        .identity
        .to_string()
        .starts_with("output = input + 0.25·attn_out + 0.25·mlp_out"));
    // Without the multiplier, the sum is wrong.
    let unscaled = check(&layer(&stages, false), &stages, 1.0);
    assert_eq!(unscaled.results[0].outcome, Outcome::Failed);
}

#[test]
fn tensors_of_other_sizes_are_not_comparable() {
    let mut stages = pre_norm(6);
    stages[2].1.truncate(CHANNELS * 5);
    let checked = check(&layer(&stages, true), &stages, 1.0);
    assert_eq!(
        checked.results[0].outcome,
        Outcome::Skipped(Skip::NotComparable)
    );
}

#[test]
fn the_tally_counts_and_lists_failures() {
    let good = pre_norm(6);
    let mut bad = pre_norm(6);
    bad.swap(2, 5);
    bad[2].0 = "attn_out";
    bad[5].0 = "mlp_out";
    let mut tally = StageCheckTally::default();
    tally.add(check(&layer(&good, true), &good, 1.0), None);
    tally.add(check(&layer(&bad, false), &bad, 1.0), Some(1));
    assert_eq!(tally.layers, 2);
    assert!(!tally.passed());
    let r1 = &tally.identities[&IdentityKind::ResidMid];
    assert_eq!((r1.passed, r1.failed, r1.passed_post_norm), (1, 1, 0));
    assert!(r1.largest_values_error.as_ref().unwrap().error < 1e-5);
    assert!(r1.largest_sketch_error.as_ref().unwrap().error > 0.1);
    let n1 = &tally.identities[&IdentityKind::AttnIn];
    assert_eq!(n1.skipped[&Skip::NeedsCaptures], 1);
    let first = tally.first_failure().unwrap();
    assert_eq!(first.rank, Some(1));
    let text = first.describe();
    assert!(
        text.starts_with("pass 0, layer 3 (rank 1): resid_mid = input + attn_out (R1): error"),
        "{text}"
    );
}

#[test]
fn the_multiplier_comes_from_the_header() {
    let mut header = crate::format::TraceReader::new(std::io::Cursor::new(
        br#"{"format":"model-trace","schema":2,"writer":"t","session":1,"process_id":1,"thread":{"id":1,"name":null},"clock":{"epoch_unix_ns":0,"session_start_ns":0},"config":{},"filter":"","capture":"","tracepoints":[],"metadata":{}}
"#.to_vec(),
    ))
    .unwrap()
    .header()
    .clone();
    assert_eq!(residual_multiplier(&header).unwrap(), 1.0);
    header
        .metadata
        .extra
        .insert(RESIDUAL_MULTIPLIER_KEY.to_owned(), "0.22".to_owned());
    assert_eq!(residual_multiplier(&header).unwrap(), 0.22);
    header
        .metadata
        .extra
        .insert(RESIDUAL_MULTIPLIER_KEY.to_owned(), "x".to_owned());
    assert!(residual_multiplier(&header)
        .unwrap_err()
        .to_string()
        .contains("not a finite number"));
}

#[test]
fn non_finite_values_skip_the_identity() {
    let mut stages = pre_norm(6);
    stages[2].1[5] = f32::NAN;
    for captured in [true, false] {
        let checked = check(&layer(&stages, captured), &stages, 1.0);
        assert_eq!(
            checked.results[0].outcome,
            Outcome::Skipped(Skip::NonFinite),
            "captured: {captured}"
        );
        // R2 and the norms do not read attn_out.
        assert_eq!(checked.results[1].outcome, Outcome::Passed);
    }
}
