//! `model-trace check TRACE`: small models of each block layout (pre-norm, sandwich norms,
//! post-norm, parallel, a residual multiplier) traced through the facade pass with their stages
//! named right, and fail, naming the layer and the identity, with two stages swapped or a norm
//! stage that normalises the wrong tensor; `diff` warns when either side fails the check, and
//! names a first divergence in the embeddings as before the first layer.

mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use model_trace::{
    trace_layer, trace_model, trace_tensor, ModelTracerConfig, Session, TensorError, TraceTensor,
};
use serde_json::Value;

use common::{run, scratch, text};

const CHANNELS: usize = 24;
const LAYERS: usize = 3;

/// Activations `[rows, CHANNELS]`, a token a row.
#[derive(Debug, Clone)]
struct Rows(Vec<f32>);

impl TraceTensor for Rows {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.0.len() / CHANNELS, CHANNELS])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(&self.0))
    }

    /// Isolation feeds a layer the reference's input.
    fn overwrite(&mut self, values: &[f32], _shape: &[usize]) -> Result<(), TensorError> {
        self.0 = values.to_vec();
        Ok(())
    }
}

impl Rows {
    fn map(&self, f: impl Fn(usize, f32) -> f32) -> Rows {
        Rows(self.0.iter().enumerate().map(|(i, &v)| f(i, v)).collect())
    }

    fn plus(&self, other: &Rows, r: f32) -> Rows {
        Rows(
            self.0
                .iter()
                .zip(&other.0)
                .map(|(a, b)| a + r * b)
                .collect(),
        )
    }

    fn rms_norm(&self) -> Rows {
        let rows = self.0.chunks(CHANNELS).flat_map(|row| {
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / CHANNELS as f32).sqrt();
            (row.iter().enumerate()).map(move |(c, v)| v / rms * (0.8 + 0.02 * c as f32))
        });
        Rows(rows.collect())
    }

    fn layer_norm(&self) -> Rows {
        let rows = self.0.chunks(CHANNELS).flat_map(|row| {
            let n = CHANNELS as f32;
            let mean = row.iter().sum::<f32>() / n;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n;
            (row.iter().enumerate())
                .map(move |(c, v)| (v - mean) / (var + 1e-12).sqrt() * 1.1 + 0.01 * c as f32)
        });
        Rows(rows.collect())
    }

    /// A stand-in for attention: each row mixes the rows up to it, through a nonlinearity.
    fn attend(&self, layer: usize) -> Rows {
        let mut out = Vec::with_capacity(self.0.len());
        for (r, row) in self.0.chunks(CHANNELS).enumerate() {
            for c in 0..CHANNELS {
                let past: f32 = (0..=r).map(|q| self.0[q * CHANNELS + c]).sum::<f32>();
                let mixed = 0.6 * row[(c + 1 + layer) % CHANNELS] + 0.4 * past / (r + 1) as f32;
                out.push(mixed.tanh());
            }
        }
        Rows(out)
    }

    /// A stand-in for an MLP.
    fn mlp(&self, layer: usize) -> Rows {
        self.map(|i, v| (v * 1.3 + 0.1 * ((i + layer) % 5) as f32).tanh() * 0.8)
    }
}

/// The embeddings of `rows` tokens (the first at `position`), rows of different scales.
fn embed(position: usize, rows: usize, scale: f32) -> Rows {
    let values = (0..rows * CHANNELS).map(|i| {
        let row = (position * CHANNELS + i) / CHANNELS;
        ((i + position * CHANNELS) as f32 * 0.377).sin() * (0.5 + 0.3 * row as f32) * scale
    });
    Rows(values.collect())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Llama: attn_in, attn_out, resid_mid, mlp_in, mlp_out.
    PreNorm,
    /// Gemma 2/3: the post-norms join the stream.
    Sandwich,
    /// BERT: the norms after the adds.
    PostNorm,
    /// Falcon: attention and MLP both read the input.
    Parallel,
    /// Granite: pre-norm, each branch scaled by this before it is added.
    Scaled(f32),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// `resid_mid` and `mlp_in` recorded in each other's place at this layer.
    SwapResidMidMlpIn(usize),
    /// `attn_in` recorded as the norm of `attn_out` at this layer (a norm of the wrong tensor).
    NormOfWrongStage(usize),
}

struct Model {
    layout: Layout,
    fault: Fault,
    /// Scales the embeddings (1: as the reference).
    embedding_scale: f32,
}

impl Model {
    fn new(layout: Layout) -> Self {
        Self {
            layout,
            fault: Fault::None,
            embedding_scale: 1.0,
        }
    }

    fn with_fault(layout: Layout, fault: Fault) -> Self {
        Self {
            fault,
            ..Self::new(layout)
        }
    }

    #[trace_layer(index = index)]
    fn block(&self, x: &Rows, index: usize) -> Rows {
        match self.layout {
            Layout::PreNorm => self.pre_norm(x, index, 1.0),
            Layout::Scaled(r) => self.pre_norm(x, index, r),
            Layout::Sandwich => {
                let attn_in = x.rms_norm();
                trace_tensor!("attn_in", &attn_in);
                let attn_out = attn_in.attend(index);
                trace_tensor!("attn_out", &attn_out);
                let attn_post_norm = attn_out.rms_norm();
                trace_tensor!("attn_post_norm", &attn_post_norm);
                let resid_mid = x.plus(&attn_post_norm, 1.0);
                trace_tensor!("resid_mid", &resid_mid);
                let mlp_in = resid_mid.rms_norm();
                trace_tensor!("mlp_in", &mlp_in);
                let mlp_out = mlp_in.mlp(index);
                trace_tensor!("mlp_out", &mlp_out);
                let mlp_post_norm = mlp_out.rms_norm();
                trace_tensor!("mlp_post_norm", &mlp_post_norm);
                resid_mid.plus(&mlp_post_norm, 1.0)
            }
            Layout::PostNorm => {
                let attn_out = x.attend(index);
                trace_tensor!("attn_out", &attn_out);
                let resid_mid = x.plus(&attn_out, 1.0).layer_norm();
                trace_tensor!("resid_mid", &resid_mid);
                let mlp_out = resid_mid.mlp(index);
                trace_tensor!("mlp_out", &mlp_out);
                resid_mid.plus(&mlp_out, 1.0).layer_norm()
            }
            Layout::Parallel => {
                let attn_in = x.layer_norm();
                trace_tensor!("attn_in", &attn_in);
                let attn_out = attn_in.attend(index);
                trace_tensor!("attn_out", &attn_out);
                let mlp_in = x.rms_norm();
                trace_tensor!("mlp_in", &mlp_in);
                let mlp_out = mlp_in.mlp(index);
                trace_tensor!("mlp_out", &mlp_out);
                x.plus(&attn_out, 1.0).plus(&mlp_out, 1.0)
            }
        }
    }

    fn pre_norm(&self, x: &Rows, index: usize, r: f32) -> Rows {
        let attn_in = x.rms_norm();
        let attn_out = attn_in.attend(index);
        if self.fault == Fault::NormOfWrongStage(index) {
            trace_tensor!("attn_in", &attn_out.rms_norm());
        } else {
            trace_tensor!("attn_in", &attn_in);
        }
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = x.plus(&attn_out, r);
        let mlp_in = resid_mid.rms_norm();
        let swap = self.fault == Fault::SwapResidMidMlpIn(index);
        trace_tensor!("resid_mid", if swap { &mlp_in } else { &resid_mid });
        trace_tensor!("mlp_in", if swap { &resid_mid } else { &mlp_in });
        let mlp_out = mlp_in.mlp(index);
        trace_tensor!("mlp_out", &mlp_out);
        resid_mid.plus(&mlp_out, r)
    }

    /// One pass over `layers` of `rows` tokens from `position`, starting from `x` (the
    /// embeddings when `None`).
    #[trace_model(position = position)]
    fn forward(
        &self,
        position: usize,
        rows: usize,
        layers: std::ops::Range<usize>,
        x: Option<Rows>,
    ) -> Rows {
        let mut x = x.unwrap_or_else(|| embed(position, rows, self.embedding_scale));
        for layer in layers {
            x = self.block(&x, layer);
        }
        x
    }

    /// A prompt of 6 tokens, then one decode step.
    fn generate(&self) {
        self.forward(0, 6, 0..LAYERS, None);
        self.forward(6, 1, 0..LAYERS, None);
    }
}

/// The run of `model` written to `dir/name`, every tensor captured if `capture`.
fn write(dir: &Path, name: &str, model: &Model, capture: bool) -> PathBuf {
    let path = dir.join(name);
    let mut builder = Session::builder(ModelTracerConfig::lightweight()).trace_file(&path);
    if capture {
        builder = builder.capture("*");
    }
    if let Layout::Scaled(r) = model.layout {
        builder = builder.extra("residual_multiplier", r.to_string());
    }
    let session = builder.start().expect("the trace file can be created");
    model.generate();
    session.finish();
    path
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `check --json` on `trace`: the exit code and the report.
fn check(trace: &Path) -> (i32, Value) {
    let output = run(&["check", path_str(trace), "--json"]);
    let code = output.status.code().unwrap_or(-1);
    let value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output)));
    (code, value)
}

/// The row of `identity` (`R1`, ...) in a check report.
fn identity<'a>(report: &'a Value, identity: &str) -> &'a Value {
    let rows = report["identities"].as_array().unwrap();
    let row = rows.iter().find(|row| row["identity"] == identity);
    row.unwrap_or_else(|| panic!("no {identity} in {report:#}"))
}

/// The identities of a report: code, passed, failed.
fn counts(report: &Value) -> Vec<(String, u64, u64)> {
    let rows = report["identities"].as_array().unwrap();
    (rows.iter())
        .map(|row| {
            let n = |key: &str| row[key].as_u64().unwrap();
            (
                row["identity"].as_str().unwrap().to_owned(),
                n("passed"),
                n("failed"),
            )
        })
        .collect()
}

#[test]
fn every_layout_with_its_stages_named_right_passes() {
    let dir = scratch("check-layouts");
    let layers = LAYERS as u64;
    let cases = [
        // R1 and R2 every layer of both passes; the norms on the prompt only.
        (
            Layout::PreNorm,
            vec![
                ("R1", 2 * layers),
                ("R2", 2 * layers),
                ("N1", layers),
                ("N2", layers),
            ],
        ),
        (
            Layout::Scaled(0.25),
            vec![
                ("R1", 2 * layers),
                ("R2", 2 * layers),
                ("N1", layers),
                ("N2", layers),
            ],
        ),
        (
            Layout::Sandwich,
            vec![
                ("R1", 2 * layers),
                ("R2", 2 * layers),
                ("N1", layers),
                ("N2", layers),
                ("N3", layers),
                ("N4", layers),
            ],
        ),
        // The post-norm form needs 4 rows: the decode step's R1 and R2 are skipped.
        (Layout::PostNorm, vec![("R1", layers), ("R2", layers)]),
        (
            Layout::Parallel,
            vec![("R3", 2 * layers), ("N1", layers), ("N2", layers)],
        ),
    ];
    for (layout, expected) in cases {
        let trace = write(
            &dir,
            &format!("{layout:?}.ndjson"),
            &Model::new(layout),
            true,
        );
        let (code, report) = check(&trace);
        assert_eq!(code, 0, "{layout:?}: {report:#}");
        let expected: Vec<(String, u64, u64)> = (expected.into_iter())
            .map(|(code, passed)| (code.to_owned(), passed, 0))
            .collect();
        assert_eq!(counts(&report), expected, "{layout:?}: {report:#}");
        assert_eq!(report["passed"], true);
        assert_eq!(report["layers"], 2 * layers);
        let values = identity(&report, counts(&report)[0].0.as_str())["largest_values_error"]
            ["error"]
            .as_f64()
            .unwrap();
        assert!(values < 1e-5, "{layout:?}: {values}");
    }
    // The multiplier is the header's: without it, the scaled block's sums are wrong.
    let (_, scaled) = check(&dir.join("Scaled(0.25).ndjson"));
    assert_eq!(scaled["residual_multiplier"], 0.25);
    let failures = (scaled["failures"].as_array()).unwrap();
    assert!(failures.is_empty());
    let text_out = text(&run(&["check", path_str(&dir.join("Scaled(0.25).ndjson"))]));
    assert!(
        text_out.contains("residual multiplier r = 0.25"),
        "{text_out}"
    );

    // The post-norm block passes in its normalised form, said as such.
    let (_, post) = check(&dir.join("PostNorm.ndjson"));
    let largest = &identity(&post, "R1")["largest_values_error"];
    assert_eq!(largest["identity"], "resid_mid ≈ norm(input + attn_out)");
    assert_eq!(identity(&post, "R1")["skipped"]["few_rows"], layers);
    assert_eq!(identity(&post, "R1")["passed_post_norm"], layers);
    let text_out = text(&run(&["check", path_str(&dir.join("PostNorm.ndjson"))]));
    assert!(
        text_out.contains("passed in the post-norm form lhs ≈ norm(rhs) (a block with no norm stage of its own, BERT's): R1 3, R2 3"),
        "{text_out}"
    );
}

#[test]
fn the_decode_step_skips_the_norms_and_summaries_skip_what_needs_values() {
    let dir = scratch("check-skips");
    let trace = write(&dir, "pre.ndjson", &Model::new(Layout::PreNorm), true);
    let (_, report) = check(&trace);
    let n1 = identity(&report, "N1");
    assert_eq!(n1["skipped"]["few_rows"], LAYERS as u64, "{report:#}");
    let text_out = text(&run(&["check", path_str(&trace)]));
    assert!(text_out.contains("N1: 3 (fewer than 4 rows)"), "{text_out}");
    assert!(
        text_out.contains("every identity checked holds"),
        "{text_out}"
    );

    // Not captured: R1 and R2 through the sketches, the norms need captures.
    let uncaptured = write(
        &dir,
        "summaries.ndjson",
        &Model::new(Layout::PreNorm),
        false,
    );
    let (code, report) = check(&uncaptured);
    assert_eq!(code, 0);
    let r1 = identity(&report, "R1");
    assert_eq!(r1["passed"], 2 * LAYERS as u64);
    assert!(r1["largest_values_error"].is_null());
    assert!(r1["largest_sketch_error"]["error"].as_f64().unwrap() < 1e-5);
    assert_eq!(
        identity(&report, "N1")["skipped"]["needs_captures"],
        LAYERS as u64
    );
    // The post-norm block from summaries: its additive form fails, which says nothing.
    let post = write(&dir, "post.ndjson", &Model::new(Layout::PostNorm), false);
    let (code, report) = check(&post);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        identity(&report, "R1")["skipped"]["needs_captures"],
        2 * LAYERS as u64
    );
    let text_out = text(&run(&["check", path_str(&post)]));
    assert!(
        text_out.contains("no identity could be decided"),
        "{text_out}"
    );
}

#[test]
fn swapped_stages_fail_naming_the_layer_and_the_identity() {
    let dir = scratch("check-swap");
    let model = Model::with_fault(Layout::PreNorm, Fault::SwapResidMidMlpIn(1));
    for capture in [false, true] {
        let trace = write(&dir, &format!("swap-{capture}.ndjson"), &model, capture);
        let (code, report) = check(&trace);
        assert_eq!(code, 1, "{report:#}");
        let first = &report["failures"][0];
        assert_eq!(
            (first["pass"].as_u64(), first["layer"].as_u64()),
            (Some(0), Some(1))
        );
        assert_eq!(first["identity"], "R1");
        assert_eq!(first["equation"], "resid_mid = input + attn_out");
        let method = if capture { "values" } else { "sketch" };
        assert_eq!(first["method"], method);
        assert!(first["error"].as_f64().unwrap() > 0.1, "{first:#}");
        // Both passes' layer 1, R1 and R2 each; with captures the prompt's N2 too.
        let expected = if capture { 5 } else { 4 };
        assert_eq!(report["failure_count"], expected, "{report:#}");
        let failures = report["failures"].as_array().unwrap();
        assert!(failures.iter().all(|f| f["layer"] == 1));

        let text_out = text(&run(&["check", path_str(&trace)]));
        assert!(
            text_out.contains("pass 0, layer 1: resid_mid = input + attn_out (R1): error"),
            "{text_out}"
        );
        assert!(text_out.contains("stage check failed:"), "{text_out}");
    }
}

#[test]
fn a_norm_of_the_wrong_stage_fails_on_captured_values() {
    let dir = scratch("check-norm");
    let model = Model::with_fault(Layout::PreNorm, Fault::NormOfWrongStage(2));
    let captured = write(&dir, "captured.ndjson", &model, true);
    let (code, report) = check(&captured);
    assert_eq!(code, 1, "{report:#}");
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report:#}");
    assert_eq!(failures[0]["identity"], "N1");
    assert_eq!(failures[0]["layer"], 2);
    assert_eq!(failures[0]["equation"], "attn_in ≈ norm(input)");
    // From summaries the norms cannot be checked: nothing fails, and the report says why.
    let summaries = write(&dir, "summaries.ndjson", &model, false);
    let (code, report) = check(&summaries);
    assert_eq!(code, 0);
    assert_eq!(identity(&report, "N1")["failed"], 0);
}

#[test]
fn the_ranks_of_a_run_are_checked_each_with_its_own_layers() {
    let dir = scratch("check-ranks");
    let path = dir.join("run.ndjson");
    let model = Model::with_fault(Layout::PreNorm, Fault::SwapResidMidMlpIn(2));
    let (to_second, from_first) = std::sync::mpsc::channel::<Rows>();
    std::thread::scope(|scope| {
        let (model, path) = (&model, &path);
        scope.spawn(move || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(path)
                .rank(0, 2)
                .run("check-ranks")
                .start()
                .unwrap();
            to_second.send(model.forward(0, 6, 0..2, None)).unwrap();
            session.finish();
        });
        scope.spawn(move || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(path)
                .rank(1, 2)
                .run("check-ranks")
                .start()
                .unwrap();
            let x = from_first.recv().unwrap();
            model.forward(0, 6, 2..LAYERS, Some(x));
            session.finish();
        });
    });
    let (code, report) = check(&path);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["trace"]["ranks"], 2);
    assert_eq!(report["layers"], LAYERS as u64);
    let first = &report["failures"][0];
    assert_eq!(
        (first["layer"].as_u64(), first["rank"].as_u64()),
        (Some(2), Some(1))
    );
    let text_out = text(&run(&["check", path_str(&path)]));
    assert!(
        text_out.contains("pass 0, layer 2 (rank 1): resid_mid"),
        "{text_out}"
    );
}

#[test]
fn bad_input_exits_2() {
    let dir = scratch("check-bad");
    let missing = run(&["check", path_str(&dir.join("none.ndjson"))]);
    assert_eq!(missing.status.code(), Some(2));
    // A header whose residual multiplier is no number.
    let path = dir.join("multiplier.ndjson");
    let session = Session::builder(ModelTracerConfig::lightweight())
        .trace_file(&path)
        .extra("residual_multiplier", "a quarter")
        .start()
        .unwrap();
    Model::new(Layout::PreNorm).forward(0, 6, 0..1, None);
    session.finish();
    let output = run(&["check", path_str(&path)]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output).contains("\"a quarter\", not a finite number"),
        "{}",
        text(&output)
    );
}

#[test]
fn diff_warns_when_a_side_fails_the_check() {
    let dir = scratch("check-diff");
    let reference = write(&dir, "ref.ndjson", &Model::new(Layout::PreNorm), false);
    let model = Model::with_fault(Layout::PreNorm, Fault::SwapResidMidMlpIn(1));
    let port = write(&dir, "port.ndjson", &model, false);
    let [reference, port] = [&reference, &port].map(|p| path_str(p));

    let output = run(&["diff", reference, port]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: the other trace ({port}) fails the stage check: pass 0, layer 1: resid_mid = input + attn_out (R1)"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("a wrong stage map rather than a numeric error"),
        "{stderr}"
    );
    assert!(!stderr.contains("the reference ("), "{stderr}");

    let output = run(&["diff", reference, port, "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["reference"]["stage_check"]["passed"], true);
    let other = &report["other"]["stage_check"];
    assert_eq!(other["passed"], false);
    assert_eq!(other["failure_count"], 4);
    assert_eq!(other["first_failure"]["layer"], 1);
    assert_eq!(other["first_failure"]["identity"], "R1");
    assert!(String::from_utf8_lossy(&output.stderr).contains("fails the stage check"));

    // The reference failing is named as the reference; a clean pair says nothing.
    let output = run(&["diff", port, reference]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("the reference ({port}) fails")),
        "{stderr}"
    );
    let output = run(&["diff", reference, reference]);
    assert!(!text(&output).contains("stage check"), "{}", text(&output));
}

#[test]
fn diff_names_a_divergence_in_the_embeddings_before_the_first_layer() {
    let dir = scratch("check-embeddings");
    let reference = write(&dir, "ref.ndjson", &Model::new(Layout::PreNorm), true);
    let scaled = Model {
        embedding_scale: 1.05,
        ..Model::new(Layout::PreNorm)
    };
    let port = write(&dir, "port.ndjson", &scaled, false);
    let [reference, port] = [&reference, &port].map(|p| path_str(p));
    let output = run(&["diff", reference, port, "--json"]);
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let first = &report["first_divergence"];
    assert_eq!(
        (first["layer"].as_u64(), first["stage"].as_str()),
        (Some(0), Some("input"))
    );
    assert_eq!(first["before_first_layer"], true);
    let text_out = text(&run(&["diff", reference, port]));
    assert!(
        text_out.contains(
            "first divergence: pass 0, before the first layer: the embeddings (layer 0, input;"
        ),
        "{text_out}"
    );

    // Isolated, every layer fed the reference's input is right: the rows say where the
    // difference came from.
    let isolated = dir.join("isolated.ndjson");
    let session = Session::builder(ModelTracerConfig::lightweight())
        .trace_file(&isolated)
        .capture("*")
        .isolate(reference)
        .start()
        .unwrap();
    scaled.generate();
    session.finish();
    let text_out = text(&run(&[
        "diff",
        reference,
        port,
        "--isolated",
        path_str(&isolated),
    ]));
    assert!(
        text_out.contains("starts before the first layer, in the embeddings"),
        "{text_out}"
    );
    assert!(
        text_out.contains("from the embeddings (before the first layer)"),
        "{text_out}"
    );
    // The isolated run records the input it was fed: its stages obey the identities too.
    assert!(!text_out.contains("stage check"), "{text_out}");

    // A divergence inside a layer is not before the first one.
    let bug = Model::with_fault(Layout::PreNorm, Fault::SwapResidMidMlpIn(1));
    let buggy = write(&dir, "buggy.ndjson", &bug, false);
    let output = run(&["diff", reference, path_str(&buggy), "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["first_divergence"]["layer"], 1);
    assert_eq!(report["first_divergence"]["before_first_layer"], false);
}
