//! `model-trace diff REF PORT --isolated ISOLATED` on a small model with a bug in one layer:
//! plain `diff` reports the first divergence and the drift after it; the isolated run names
//! the buggy layer and no other.

mod common;

use std::path::{Path, PathBuf};

use model_trace::{trace_layer, trace_model, trace_stage, ModelTracerConfig, Session};

use common::{run, scratch, text};

struct Model {
    /// The layer whose attention scale is wrong, if any.
    bug: Option<usize>,
}

impl Model {
    #[trace_layer(index = index)]
    fn block(&self, x: &Vec<f32>, index: usize) -> Vec<f32> {
        let scale = if self.bug == Some(index) { 1.1 } else { 1.0 };
        let attn: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v * scale + i as f32 * 0.01).tanh())
            .collect();
        let attn = trace_stage!("attn_out", attn);
        x.iter().zip(&attn).map(|(a, b)| a + 0.5 * b).collect()
    }

    #[trace_model]
    fn forward(&self) -> Vec<f32> {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        for layer in 0..4 {
            x = self.block(&x, layer);
        }
        x
    }
}

/// One pass of `model` into `dir/name`, captured or isolated as asked.
fn write(dir: &Path, name: &str, model: &Model, capture: bool, isolate: Option<&Path>) -> PathBuf {
    let path = dir.join(name);
    let mut builder = Session::builder(ModelTracerConfig::lightweight()).trace_file(&path);
    if capture {
        builder = builder.capture("*");
    }
    if let Some(reference) = isolate {
        builder = builder.isolate(reference);
    }
    let session = builder.start().expect("session");
    model.forward();
    session.finish();
    path
}

fn json(args: &[&str]) -> (i32, serde_json::Value) {
    let output = run(args);
    let code = output.status.code().unwrap_or(-1);
    let value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output)));
    (code, value)
}

#[test]
fn isolation_names_the_buggy_layer_and_no_other() {
    let dir = scratch("isolation");
    let reference = write(&dir, "ref.ndjson", &Model { bug: None }, true, None);
    let buggy = Model { bug: Some(1) };
    let port = write(&dir, "port.ndjson", &buggy, false, None);
    let isolated = write(&dir, "isolated.ndjson", &buggy, true, Some(&reference));
    let [reference, port, isolated] = [&reference, &port, &isolated].map(|p| p.to_str().unwrap());

    let (code, plain) = json(&["diff", reference, port, "--json"]);
    assert_eq!(code, 1);
    assert_eq!(plain["first_divergence"]["layer"], 1);

    let (code, both) = json(&["diff", reference, port, "--isolated", isolated, "--json"]);
    assert_eq!(code, 1, "a layer is wrong on its own");
    assert_eq!(both["first_local_divergence"]["layer"], 1);
    assert_eq!(both["first_local_divergence"]["stage"], "attn_out");
    let rows = both["local_layers"].as_array().unwrap();
    let local_ratio = |layer: usize| rows[layer]["local"]["ratio"].as_f64().unwrap();
    let inherited_ratio = |layer: usize| rows[layer]["inherited"]["ratio"].as_f64().unwrap();
    assert!(local_ratio(1) > 1.0);
    for layer in [0, 2, 3] {
        assert!(
            local_ratio(layer) <= 1.0,
            "layer {layer}: {}",
            local_ratio(layer)
        );
    }
    assert!(
        inherited_ratio(3) > 1.0,
        "the bug's drift reaches layer 3 in the plain run"
    );
    assert!(both.get("isolation_warning").is_none());

    let text_out = text(&run(&["diff", reference, port, "--isolated", isolated]));
    assert!(
        text_out.contains("first layer wrong on its own: pass 0, layer 1, attn_out"),
        "{text_out}"
    );

    // The isolated run alone: its first divergence is the layer's own.
    let (_, alone) = json(&["diff", reference, isolated, "--json"]);
    assert_eq!(alone["first_divergence"]["layer"], 1);
    let list = text(&run(&["list", isolated]));
    assert!(list.contains("changed by: stage=input replace("), "{list}");

    // Not captured, the isolated run is judged by its summaries, which is said.
    let uncaptured = write(
        &dir,
        "uncaptured.ndjson",
        &buggy,
        false,
        Some(Path::new(reference)),
    );
    let uncaptured = uncaptured.to_str().unwrap();
    let (_, summaries) = json(&["diff", reference, port, "--isolated", uncaptured, "--json"]);
    let warning = summaries["isolation_warning"].as_str().unwrap();
    assert!(warning.contains("compared by their summaries"), "{warning}");
}

#[test]
fn a_clean_port_is_wrong_nowhere_and_a_plain_run_is_no_isolated_one() {
    let dir = scratch("isolation-clean");
    let reference = write(&dir, "ref.ndjson", &Model { bug: None }, true, None);
    let clean = Model { bug: None };
    let port = write(&dir, "port.ndjson", &clean, false, None);
    let isolated = write(&dir, "isolated.ndjson", &clean, false, Some(&reference));
    let [reference, port, isolated] = [&reference, &port, &isolated].map(|p| p.to_str().unwrap());
    let (code, both) = json(&["diff", reference, port, "--isolated", isolated, "--json"]);
    assert_eq!(code, 0);
    assert!(both["first_local_divergence"].is_null());

    let (_, not_isolated) = json(&["diff", reference, port, "--isolated", port, "--json"]);
    let warning = not_isolated["isolation_warning"].as_str().unwrap();
    assert!(warning.contains("no isolated run"), "{warning}");
}
