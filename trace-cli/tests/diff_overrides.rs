//! `diff`'s per-name settings: an override that matches no tensor is a warning (stderr, and
//! the JSON's `warnings`), and `--check-error-stat NAME:STAT` judges the tensors it names by
//! another statistic, leaving the others' verdicts as they were.

mod common;

use std::path::{Path, PathBuf};

use model_trace::{trace_layer, trace_model, trace_tensor};

use common::{run, scratch, text, write_run};

/// Three element-wise layers; `spike` adds 1 to one element of layer 1's `mlp_out`, which
/// then stays in that one element of every later tensor.
struct Model {
    spike: bool,
}

impl Model {
    #[trace_layer]
    fn block(&self, x: &[f32], index: usize) -> Vec<f32> {
        let attn_out: Vec<f32> = x.iter().map(|v| (v * 0.9).tanh()).collect();
        trace_tensor!("attn_out", &attn_out);
        let mut mlp_out: Vec<f32> = attn_out.iter().map(|v| v * 0.5 - 0.1).collect();
        if self.spike && index == 1 {
            mlp_out[5] += 1.0;
        }
        trace_tensor!("mlp_out", &mlp_out);
        x.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
    }

    #[trace_model(position = position)]
    fn forward(&self, position: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..64)
            .map(|i| ((i + position) as f32 * 0.37).sin())
            .collect();
        for layer in 0..3 {
            x = self.block(&x, layer);
        }
        x
    }
}

/// Two passes, every tensor captured.
fn write_trace(dir: &Path, name: &str, spike: bool) -> String {
    let path: PathBuf = dir.join(name);
    let model = Model { spike };
    write_run(&path, true, None, || {
        for position in 0..2 {
            model.forward(position);
        }
    });
    path.to_str().expect("a UTF-8 path").to_owned()
}

fn json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let output = run(args);
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

fn first_divergence(value: &serde_json::Value) -> (Option<u64>, Option<u64>, Option<&str>) {
    let first = &value["first_divergence"];
    (
        first["pass"].as_u64(),
        first["layer"].as_u64(),
        first["stage"].as_str(),
    )
}

#[test]
fn an_override_that_matches_nothing_is_a_warning() {
    let dir = scratch("unused-override");
    let reference = write_trace(&dir, "reference.ndjson", false);
    let same = write_trace(&dir, "same.ndjson", false);
    let spiked = write_trace(&dir, "spiked.ndjson", true);

    // The exit code is the comparison's: 0 for the same trace, 1 for the spiked one.
    let matched = run(&["diff", "--atol", "layer.9.*:1", &reference, &same]);
    assert_eq!(matched.status.code(), Some(0), "{}", text(&matched));
    let stderr = String::from_utf8_lossy(&matched.stderr);
    assert!(
        stderr.contains("warning: --atol layer.9.*:... matches no tensor"),
        "{stderr}"
    );
    let diverged = run(&[
        "diff",
        "--rtol",
        "layer.*.mlp_oot:1",
        "--atol",
        "layer.1.*:1e-4",
        &reference,
        &spiked,
    ]);
    assert_eq!(diverged.status.code(), Some(1), "{}", text(&diverged));
    let stderr = String::from_utf8_lossy(&diverged.stderr);
    assert!(stderr.contains("--rtol layer.*.mlp_oot:..."), "{stderr}");
    assert!(
        !stderr.contains("layer.1.*"),
        "an override that matches is no warning: {stderr}"
    );

    let (code, value) = json(&[
        "diff",
        "--json",
        "--check-error-stat",
        "layer.*.nothing:mean",
        &reference,
        &same,
    ]);
    assert_eq!(code, Some(0));
    let warnings: Vec<&str> = value["warnings"]
        .as_array()
        .expect("a warnings array")
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("--check-error-stat layer.*.nothing:..."),
        "{warnings:?}"
    );
}

#[test]
fn a_per_name_error_stat_changes_that_tensors_verdict_only() {
    let dir = scratch("per-name-stat");
    let reference = write_trace(&dir, "reference.ndjson", false);
    let spiked = write_trace(&dir, "spiked.ndjson", true);
    let counts = |value: &serde_json::Value| {
        let c = &value["compared"];
        (c["close"].as_u64(), c["diverged"].as_u64())
    };

    // Every element decides: the spike diverges where it enters, and in every later tensor.
    let (code, strict) = json(&["diff", "--json", &reference, &spiked]);
    assert_eq!(code, Some(1));
    assert_eq!(
        first_divergence(&strict),
        (Some(0), Some(1), Some("mlp_out"))
    );
    let (close, diverged) = counts(&strict);
    let (close, diverged) = (close.unwrap(), diverged.unwrap());

    // The median of the one tensor's errors is 0: it is close, in both passes, and nothing
    // else changes.
    let (code, per_name) = json(&[
        "diff",
        "--json",
        "--check-error-stat",
        "layer.1.mlp_out:median",
        &reference,
        &spiked,
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(
        first_divergence(&per_name),
        (Some(0), Some(1), Some("output"))
    );
    assert_eq!(counts(&per_name), (Some(close + 2), Some(diverged - 2)));
    assert!(per_name["warnings"].as_array().unwrap().is_empty());
    assert_eq!(
        per_name["tolerance"]["error_stat_overrides"][0][1].as_str(),
        Some("median")
    );

    // The same statistic as the default judges every tensor by it.
    let global = run(&["diff", "--check-error-stat", "median", &reference, &spiked]);
    assert_eq!(global.status.code(), Some(0), "{}", text(&global));

    // The text says which criterion judged the first divergence when it is not the default.
    let text_out = run(&[
        "diff",
        "--check-error-stat",
        "layer.1.*:median",
        "--check-error-stat",
        "layer.1.output:norm",
        &reference,
        &spiked,
    ]);
    assert_eq!(text_out.status.code(), Some(1), "{}", text(&text_out));
    let said = text(&text_out);
    assert!(
        said.contains("elementwise criterion (median for layer.1.*, norm for layer.1.output)"),
        "{said}"
    );
    assert!(
        said.contains("first divergence: pass 0, layer 1, output"),
        "{said}"
    );
    assert!(
        said.contains(", norm criterion; compared value by value"),
        "{said}"
    );
}

#[test]
fn help_lists_the_error_statistics() {
    let help = run(&["diff", "--help"]);
    assert!(help.status.success());
    let said = text(&help);
    for stat in ["elementwise", "mean", "median", "quantile", "norm"] {
        assert!(said.contains(&format!("- {stat}:")), "{stat} in {said}");
    }
    assert!(said.contains("[NAME:]STAT"), "{said}");
    let bad = run(&["diff", "--check-error-stat", "worst", "a", "b"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("worst"), "{}", text(&bad));
}
