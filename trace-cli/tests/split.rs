//! `diff REF PORT --quantized PORT_Q`: the error of the quantized run split into the
//! quantization's part (PORT_Q − PORT) and the logic's (PORT − REF). The traces here are built
//! so: PORT = REF + a, PORT_Q = PORT + b, with a and b known per layer, so the parts must be
//! ‖b‖/‖REF‖ and ‖a‖/‖REF‖, and they are computed here from the same values.

mod common;

use std::path::Path;

use model_trace::{trace_layer, trace_model, trace_quant, trace_tensor, Precision, TensorRef};
use serde_json::Value;

use common::{embedded_data, run, scratch, text, write_session};

const LAYERS: usize = 4;
const WIDTH: usize = 96;
const STAGES: [&str; 2] = ["attn_out", "mlp_out"];
/// Tensors a layer records: its input and output (the same in the three runs) and [`STAGES`].
const TENSORS: usize = LAYERS * (2 + STAGES.len());
/// The logic's relative size everywhere but [`BUG_LAYER`]: float rounding (large enough that
/// f32's own rounding of REF + a is a small part of it).
const ROUNDING: f32 = 3e-5;
/// The logic's relative size in [`BUG_LAYER`]'s `mlp_out`: a bug, below the quantization.
const BUG: f32 = 2e-3;
const BUG_LAYER: usize = 2;
/// The quantization's relative size: `attn_out`'s, `mlp_out`'s (the larger, so that every
/// layer's worst stage by total is `mlp_out`).
const QUANTIZATION: [f32; 2] = [0.03, 0.04];
/// The quantized matmul's relative error against its own f32 matmul (the quant records).
const MATMUL_ERROR: f32 = 0.02;

/// Which of the three runs.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    Reference,
    Port,
    Quantized,
}

/// The reference's values of `stage` in `layer`.
fn reference(layer: usize, stage: &str) -> Vec<f32> {
    let offset = if stage == "mlp_out" { 0.5 } else { 0.0 };
    (0..WIDTH)
        .map(|i| ((i as f32 + 1.0) * 0.41 + layer as f32 + offset).sin() * 1.5 + 0.25)
        .collect()
}

/// a: the logic's difference (alternating sign).
fn logic(layer: usize, stage: &str) -> Vec<f32> {
    logic_with(layer, stage, "mlp_out")
}

/// a, the bug in `bug_stage` of [`BUG_LAYER`].
fn logic_with(layer: usize, stage: &str, bug_stage: &str) -> Vec<f32> {
    let size = if (layer, stage) == (BUG_LAYER, bug_stage) {
        BUG
    } else {
        ROUNDING
    };
    let r = reference(layer, stage);
    (0..WIDTH)
        .map(|i| if i % 2 == 0 { size } else { -size } * r[i].abs())
        .collect()
}

/// b: the quantization's difference (another sign pattern).
fn quantization(layer: usize, stage: &str) -> Vec<f32> {
    let r = reference(layer, stage);
    let size = QUANTIZATION[usize::from(stage == "mlp_out")];
    (0..WIDTH)
        .map(|i| if i % 3 == 0 { -size } else { size } * r[i].abs())
        .collect()
}

/// What `run` records for `stage` of `layer`: REF, REF + a, (REF + a) + b.
fn values(run: Run, layer: usize, stage: &str) -> Vec<f32> {
    values_with(run, layer, stage, "mlp_out")
}

/// [`values`], the bug in `bug_stage` of [`BUG_LAYER`].
fn values_with(run: Run, layer: usize, stage: &str, bug_stage: &str) -> Vec<f32> {
    let r = reference(layer, stage);
    if run == Run::Reference {
        return r;
    }
    let port: Vec<f32> = r
        .iter()
        .zip(logic_with(layer, stage, bug_stage))
        .map(|(r, a)| r + a)
        .collect();
    if run == Run::Port {
        return port;
    }
    let b = quantization(layer, stage);
    port.iter().zip(b).map(|(p, b)| p + b).collect()
}

struct Model {
    run: Run,
    variant: Variant,
}

/// How a run differs from the others (the tests of what the split must not hide or split).
#[derive(Clone, Copy)]
struct Variant {
    /// The stage of [`BUG_LAYER`] with the logic bug.
    bug_stage: &'static str,
    /// `mlp_out`'s shape: `[WIDTH]`, or another of as many elements.
    mlp_shape: &'static [usize],
    /// The token ids each pass consumed, one pass each.
    tokens: &'static [&'static [u32]],
}

/// The prompt, then one generated token.
const TOKENS: [&[u32]; 2] = [&[1, 504, 3575], &[7042]];

impl Default for Variant {
    fn default() -> Self {
        Self {
            bug_stage: "mlp_out",
            mlp_shape: &[WIDTH],
            tokens: &TOKENS[..1],
        }
    }
}

impl Model {
    #[allow(clippy::ptr_arg)]
    fn exact(&self, x: &Vec<f32>) -> Vec<f32> {
        x.iter().map(|v| v * 0.5).collect()
    }

    /// The quantized matmul: its f32 matmul off by [`MATMUL_ERROR`] (relative, every element).
    #[allow(clippy::ptr_arg)]
    #[trace_quant(reference = Self::exact, quant = Q4_K, name = "ffn_down")]
    fn quantized_matmul(&self, x: &Vec<f32>) -> Vec<f32> {
        x.iter().map(|v| v * 0.5 * (1.0 + MATMUL_ERROR)).collect()
    }

    #[allow(clippy::ptr_arg)]
    #[trace_layer(index = index)]
    fn block(&self, x: &Vec<f32>, index: usize) -> Vec<f32> {
        let bug_stage = self.variant.bug_stage;
        let attn_out = values_with(self.run, index, "attn_out", bug_stage);
        trace_tensor!("attn_out", &attn_out);
        let mlp_out = values_with(self.run, index, "mlp_out", bug_stage);
        let shape = self.variant.mlp_shape;
        trace_tensor!("mlp_out", &TensorRef::new(&mlp_out, shape).unwrap());
        if self.run == Run::Quantized {
            self.quantized_matmul(x);
        }
        x.clone()
    }

    #[trace_model(tokens = ids)]
    fn forward(&self, ids: &[u32]) {
        let mut x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.1).cos() + 1.0).collect();
        for layer in 0..LAYERS {
            x = self.block(&x, layer);
        }
    }
}

/// `run` into `dir/name`, captured if `capture`, its header saying `precision`.
fn write(dir: &Path, name: &str, run: Run, capture: bool, precision: Precision) -> String {
    write_variant(dir, name, run, Variant::default(), capture, precision)
}

/// [`write`], the run differing as `variant` says.
fn write_variant(
    dir: &Path,
    name: &str,
    run: Run,
    variant: Variant,
    capture: bool,
    precision: Precision,
) -> String {
    let path = dir.join(name);
    let config = model_trace::ModelTracerConfig {
        trace_quant_error: true,
        ..model_trace::ModelTracerConfig::lightweight()
    };
    write_session(
        &path,
        config,
        |builder| {
            let builder = builder.precision(precision);
            if capture {
                builder.capture("*")
            } else {
                builder
            }
        },
        || {
            let model = Model { run, variant };
            for &ids in variant.tokens {
                model.forward(ids);
            }
        },
    );
    path.to_str().expect("a UTF-8 path").to_owned()
}

fn quantized_precision() -> Precision {
    Precision::quantized(["Q4_K", "Q6_K"])
        .activations("F32")
        .source("the port")
}

/// The three runs, their headers as the split expects.
fn traces(dir: &Path, capture: bool) -> [String; 3] {
    [
        write(
            dir,
            "ref.ndjson",
            Run::Reference,
            capture,
            Precision::float("F32").source("transformers"),
        ),
        write(
            dir,
            "port.ndjson",
            Run::Port,
            capture,
            quantized_precision().dequantized_to("F32"),
        ),
        write(
            dir,
            "q.ndjson",
            Run::Quantized,
            capture,
            quantized_precision(),
        ),
    ]
}

/// `diff --json ARGS...`: the exit code and the report.
fn diff_json(args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["diff", "--json"];
    all.extend(args);
    let output = run(&all);
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

fn norm(values: &[f32]) -> f64 {
    values
        .iter()
        .map(|&v| f64::from(v).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// `‖x − y‖` of f32 vectors, in f64.
fn distance(x: &[f32], y: &[f32]) -> f64 {
    (x.iter().zip(y))
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// The split's tensors of [`STAGES`] (the layers' inputs and outputs, equal in the three runs,
/// left out).
fn stage_tensors(split: &Value) -> impl Iterator<Item = &Value> {
    let tensors = split["tensors"].as_array().expect("the tensors").iter();
    let staged: Vec<&Value> = tensors
        .filter(|t| STAGES.contains(&t["stage"].as_str().unwrap()))
        .collect();
    assert_eq!(staged.len(), LAYERS * STAGES.len());
    staged.into_iter()
}

fn close(actual: f64, expected: f64, relative: f64) -> bool {
    (actual - expected).abs() <= relative * expected.abs()
}

#[test]
fn the_parts_of_known_differences_are_their_norms_and_add_up() {
    let dir = scratch("split-exact");
    let [reference, port, quantized] = traces(&dir, true);
    let (code, report) = diff_json(&[&reference, &port, "--quantized", &quantized]);
    // The verdict is the port's against the reference at the tight tolerance: the bug.
    assert_eq!(report["tolerance_choice"]["rule"], "same_float_weights");
    assert_eq!(code, Some(1));
    let first = &report["first_divergence"];
    assert_eq!(
        (first["layer"].as_u64(), first["stage"].as_str()),
        (Some(BUG_LAYER as u64), Some("mlp_out"))
    );
    let split = &report["split"];
    assert_eq!(split["split"], TENSORS);
    assert_eq!(split["exact"], TENSORS);
    assert_eq!(split["estimated"], 0);
    assert_eq!(split["not_in_quantized"], 0);
    assert!(
        split["identity_residual"].as_f64().unwrap() <= 1e-12,
        "{split:#}"
    );
    assert_eq!(split["quantized"]["path"], quantized.as_str());
    for tensor in stage_tensors(split) {
        let (layer, stage) = (
            tensor["layer"].as_u64().unwrap() as usize,
            tensor["stage"].as_str().unwrap(),
        );
        let r = values(Run::Reference, layer, stage);
        let p = values(Run::Port, layer, stage);
        let q = values(Run::Quantized, layer, stage);
        let of = |field: &str| tensor[field].as_f64().unwrap();
        // The same values, the same arithmetic: equal but for the order of nothing.
        assert!(
            close(of("total"), distance(&q, &r) / norm(&r), 1e-12),
            "{tensor}"
        );
        assert!(
            close(of("quantization"), distance(&q, &p) / norm(&r), 1e-12),
            "{tensor}"
        );
        assert!(
            close(of("logic"), distance(&p, &r) / norm(&r), 1e-12),
            "{tensor}"
        );
        // And the known vectors, up to the f32 rounding of the sums.
        let a = logic(layer, stage);
        let b = quantization(layer, stage);
        assert!(
            close(of("quantization"), norm(&b) / norm(&r), 1e-4),
            "{tensor}"
        );
        assert!(close(of("logic"), norm(&a) / norm(&r), 1e-2), "{tensor}");
        assert_eq!(tensor["exact"], true);
    }
    let layers = split["layers"].as_array().unwrap();
    assert_eq!(layers.len(), LAYERS);
    for row in layers {
        assert_eq!(row["stage"], "mlp_out", "{row}");
        assert_eq!(row["dominant"], "quantization", "{row}");
        let records = &row["quant_records"];
        assert_eq!(records["records"], 1, "{row}");
        let worst = records["worst_relative_error"].as_f64().unwrap();
        assert!(close(worst, f64::from(MATMUL_ERROR), 1e-3), "{row}");
    }
    let bug = &layers[BUG_LAYER];
    assert_eq!(bug["stage"], "mlp_out");
    let logic_part = bug["logic"].as_f64().unwrap();
    assert!(close(logic_part, f64::from(BUG), 1e-2), "{bug}");
    assert!(
        split["warnings"].as_array().unwrap().is_empty(),
        "{split:#}"
    );
}

#[test]
fn the_text_shows_the_split_per_layer() {
    let dir = scratch("split-text");
    let [reference, port, quantized] = traces(&dir, true);
    let output = run(&["diff", &reference, &port, "--quantized", &quantized]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(&format!("quantized: {quantized} (")), "{out}");
    let split: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("error split,"))
        .collect();
    assert!(
        split[0].starts_with("error split, pass 0: total (quantized − reference)"),
        "{out}"
    );
    assert!(
        split[1].contains("quantization") && split[1].ends_with("quant records"),
        "{out}"
    );
    let bug_row = split[2 + BUG_LAYER];
    assert!(
        bug_row
            .trim_start()
            .starts_with(&format!("{BUG_LAYER}  mlp_out")),
        "{bug_row}"
    );
    assert!(
        bug_row.contains("2.00e-3") && bug_row.contains("quantization"),
        "{bug_row}"
    );
    assert!(bug_row.ends_with("2.00e-2 (1)"), "{bug_row}");
    assert!(
        out.contains("identity: |quantization + logic − total| at most 0.0e0 over the 16 tensors split (16 from captures, 0 ≈ from sketches)"),
        "{out}"
    );
    println!("{out}");
}

#[test]
fn without_captures_the_split_is_estimated_from_the_sketches() {
    let dir = scratch("split-sketches");
    let [ref_path, port, quantized] = traces(&dir, false);
    let (_, report) = diff_json(&[&ref_path, &port, "--quantized", &quantized]);
    let split = &report["split"];
    assert_eq!(split["estimated"], TENSORS, "{split:#}");
    assert_eq!(split["exact"], 0);
    for tensor in stage_tensors(split) {
        let (layer, stage) = (
            tensor["layer"].as_u64().unwrap() as usize,
            tensor["stage"].as_str().unwrap(),
        );
        let r = reference(layer, stage);
        let expected = norm(&quantization(layer, stage)) / norm(&r);
        let estimate = tensor["quantization"].as_f64().unwrap();
        // Eight ±1 projections: the expectation is the norm, within a factor of 2 mostly.
        assert!(
            estimate > expected / 2.0 && estimate < expected * 2.0,
            "{tensor} against {expected}"
        );
        assert_eq!(tensor["exact"], false);
        // The sketch is linear: the identity holds on the sketches to their f32 rounding.
        assert!(
            tensor["identity_residual"].as_f64().unwrap() < 1e-5,
            "{tensor}"
        );
    }
    let output = run(&["diff", &ref_path, &port, "--quantized", &quantized]);
    let out = text(&output);
    assert!(
        out.contains("(0 from captures, 16 ≈ from sketches)"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("    0  ") && l.contains("≈")),
        "{out}"
    );
}

#[test]
fn headers_against_the_premise_are_warned_of() {
    let dir = scratch("split-premise");
    let [reference, _, _] = traces(&dir, true);
    // The "quantized" run says F32 weights; the "port" says quantized ones.
    let not_quantized = write(
        &dir,
        "nq.ndjson",
        Run::Quantized,
        true,
        Precision::float("F32"),
    );
    let quantized_port = write(&dir, "qp.ndjson", Run::Port, true, quantized_precision());
    let (_, report) = diff_json(&[&reference, &quantized_port, "--quantized", &not_quantized]);
    let warnings: Vec<&str> = (report["split"]["warnings"].as_array().unwrap().iter())
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("its header says its weights are not quantized (F32 weights)"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("its header says its weights are quantized (Q4_K, Q6_K weights"),
        "{warnings:?}"
    );
    let output = run(&[
        "diff",
        &reference,
        &quantized_port,
        "--quantized",
        &not_quantized,
    ]);
    assert!(text(&output).contains(&format!(
        "warning: the quantized run {not_quantized}: its header says"
    )));
}

#[test]
fn report_plots_the_three_parts_per_layer() {
    let dir = scratch("split-report");
    let [reference, port, quantized] = traces(&dir, true);
    let page = dir.join("page.html");
    let output = run(&[
        "report",
        &port,
        "--against",
        &reference,
        "--quantized",
        &quantized,
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("\"diff-split\""), "the plot's element");
    let data = embedded_data(&html);
    let split = &data["diff"]["split"];
    for part in ["total", "quantization", "logic", "quant_records"] {
        assert_eq!(
            split[part].as_array().map(Vec::len),
            Some(LAYERS),
            "{part}: {split:#}"
        );
    }
    let logic = split["logic"][BUG_LAYER].as_f64().unwrap();
    assert!(close(logic, f64::from(BUG), 1e-2), "{split:#}");
    assert_eq!(split["exact"], true);
    assert!(data["diff"]["text"]
        .as_str()
        .unwrap()
        .contains("error split, pass 0"));
    // --quantized needs --against in a report.
    let output = run(&[
        "report",
        &port,
        "--quantized",
        &quantized,
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
}

#[test]
fn the_split_conflicts_with_comparisons_by_position() {
    let dir = scratch("split-conflicts");
    let [reference, port, quantized] = traces(&dir, false);
    for mode in [&["--by-position"][..], &["--batch", &port][..]] {
        let mut args = vec!["diff", &reference, &port, "--quantized", &quantized];
        args.extend(mode);
        let output = run(&args);
        let out = text(&output);
        assert_eq!(output.status.code(), Some(2), "{out}");
        assert!(out.contains("cannot be used with"), "{out}");
    }
}

#[test]
fn tensors_whose_shapes_differ_are_not_split() {
    let dir = scratch("split-shapes");
    let [reference, port, _] = traces(&dir, true);
    // The quantized run's mlp_out as [12, 8]: as many elements as the others' [96], but not
    // the same tensor elementwise. And [1, 96] is [96].
    for (shape, differ) in [(&[12, 8][..], true), (&[1, WIDTH][..], false)] {
        let variant = Variant {
            mlp_shape: shape,
            ..Variant::default()
        };
        let quantized = write_variant(
            &dir,
            if differ {
                "q-reshaped.ndjson"
            } else {
                "q-unsqueezed.ndjson"
            },
            Run::Quantized,
            variant,
            true,
            quantized_precision(),
        );
        let (_, report) = diff_json(&[&reference, &port, "--quantized", &quantized]);
        let split = &report["split"];
        let (not_split, split_count) = if differ {
            (LAYERS, TENSORS - LAYERS)
        } else {
            (0, TENSORS)
        };
        assert_eq!(split["not_split"], not_split, "{shape:?}: {split:#}");
        assert_eq!(split["shapes_differ"], not_split, "{shape:?}: {split:#}");
        assert_eq!(split["split"], split_count, "{shape:?}: {split:#}");
        let staged = (split["tensors"].as_array().unwrap().iter()).any(|t| t["stage"] == "mlp_out");
        assert_eq!(staged, !differ, "{shape:?}: {split:#}");
        if differ {
            let output = run(&["diff", &reference, &port, "--quantized", &quantized]);
            let out = text(&output);
            assert!(
                out.contains(&format!(
                    "{LAYERS} could not be split ({LAYERS} of them shapes that differ;"
                )),
                "{out}"
            );
        }
    }
}

#[test]
fn a_layer_row_names_its_worst_logic_stage() {
    let dir = scratch("split-worst-logic");
    // The bug in BUG_LAYER's attn_out: its mlp_out has the larger total (its quantization the
    // larger), and the bug must not hide behind it.
    let variant = Variant {
        bug_stage: "attn_out",
        ..Variant::default()
    };
    let [reference, port, quantized] = [
        ("ref.ndjson", Run::Reference, Precision::float("F32")),
        (
            "port.ndjson",
            Run::Port,
            quantized_precision().dequantized_to("F32"),
        ),
        ("q.ndjson", Run::Quantized, quantized_precision()),
    ]
    .map(|(name, run, precision)| write_variant(&dir, name, run, variant, true, precision));
    let (_, report) = diff_json(&[&reference, &port, "--quantized", &quantized]);
    let layers = report["split"]["layers"].as_array().unwrap();
    let row = &layers[BUG_LAYER];
    assert_eq!(row["stage"], "mlp_out", "{row}");
    assert!(
        close(row["logic"].as_f64().unwrap(), f64::from(ROUNDING), 1e-1),
        "{row}"
    );
    assert_eq!(row["worst_logic_stage"], "attn_out", "{row}");
    let worst = row["worst_logic"].as_f64().unwrap();
    assert!(close(worst, f64::from(BUG), 1e-2), "{row}");
    assert_eq!(row["worst_quantization_stage"], "mlp_out", "{row}");
    let worst = row["worst_quantization"].as_f64().unwrap();
    assert!(close(worst, f64::from(QUANTIZATION[1]), 1e-3), "{row}");
    assert_eq!(row["dominant"], "quantization", "{row}");
    // Another layer's worst logic is its rounding.
    assert!(
        close(
            layers[0]["worst_logic"].as_f64().unwrap(),
            f64::from(ROUNDING),
            1e-1
        ),
        "{layers:?}"
    );
    let output = run(&["diff", &reference, &port, "--quantized", &quantized]);
    let out = text(&output);
    let split: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("error split,"))
        .collect();
    assert!(split[1].contains("  worst logic  "), "{out}");
    let bug_row = split[2 + BUG_LAYER];
    assert!(
        bug_row
            .trim_start()
            .starts_with(&format!("{BUG_LAYER}  mlp_out")),
        "{bug_row}"
    );
    assert!(bug_row.contains("2.00e-3 attn_out"), "{bug_row}");
    // The report plots the layer's largest logic part.
    let page = dir.join("page.html");
    let output = run(&[
        "report",
        &port,
        "--against",
        &reference,
        "--quantized",
        &quantized,
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    let split = &data["diff"]["split"];
    let logic = split["logic"][BUG_LAYER].as_f64().unwrap();
    assert!(close(logic, f64::from(BUG), 1e-2), "{split:#}");
    assert_eq!(split["logic_stages"][BUG_LAYER], "attn_out", "{split:#}");
    assert_eq!(split["stages"][BUG_LAYER], "mlp_out", "{split:#}");
}

#[test]
fn a_pass_the_quantized_run_consumed_other_tokens_in_is_not_split() {
    let dir = scratch("split-tokens");
    // Two passes; the quantized run's second consumed another token.
    let same = Variant {
        tokens: &TOKENS,
        ..Variant::default()
    };
    let other = Variant {
        tokens: &[TOKENS[0], &[9999]],
        ..Variant::default()
    };
    let [reference, port, quantized] = [
        ("ref.ndjson", Run::Reference, same, Precision::float("F32")),
        (
            "port.ndjson",
            Run::Port,
            same,
            quantized_precision().dequantized_to("F32"),
        ),
        ("q.ndjson", Run::Quantized, other, quantized_precision()),
    ]
    .map(|(name, run, variant, precision)| {
        write_variant(&dir, name, run, variant, true, precision)
    });
    let (_, report) = diff_json(&[&reference, &port, "--quantized", &quantized]);
    let split = &report["split"];
    assert_eq!(split["split"], TENSORS, "only pass 0: {split:#}");
    assert_eq!(split["passes_other_tokens"], 1, "{split:#}");
    assert_eq!(split["first_pass_other_tokens"], 1, "{split:#}");
    assert_eq!(split["table_pass"], 0, "{split:#}");
    assert_eq!(split["layers"].as_array().unwrap().len(), LAYERS);
    let output = run(&["diff", &reference, &port, "--quantized", &quantized]);
    let out = text(&output);
    assert!(
        out.contains(
            "1 passes not split, the other or the quantized run consuming other token ids than \
             the reference, the first of them pass 1"
        ),
        "{out}"
    );
    // The same tokens throughout: both passes split, nothing said.
    let (_, report) = diff_json(&[&reference, &port, "--quantized", &port]);
    let split = &report["split"];
    assert_eq!(split["split"], 2 * TENSORS, "{split:#}");
    assert_eq!(split["passes_other_tokens"], 0, "{split:#}");
    assert!(split["first_pass_other_tokens"].is_null(), "{split:#}");
}
