//! `diff REF OTHER --floor FLOOR [--floor-factor K]`: each tensor's rtol is the larger of the
//! given one and K times the floor's error (the smallest rtol at which FLOOR is close to REF).
//! The traces here differ from the reference by a known relative error per tensor, so the
//! floor's error and the allowed rtol are computed here from the values themselves.

mod common;

use std::path::{Path, PathBuf};

use model_trace::{trace_layer, trace_model, trace_tensor};

use common::{embedded_data, run, scratch, text, write_run};

/// The default `--atol`.
const ATOL: f64 = 1e-5;
/// The default `--rtol`.
const RTOL: f64 = 1e-5;
const LAYERS: usize = 4;
const PASSES: usize = 2;
/// The floor's relative error, on every traced tensor.
const FLOOR: f32 = 1e-3;
/// The other's on every tensor but one: past the given rtol, within twice the floor's.
const WITHIN: f32 = 1.5e-3;
/// The other's on [`BAD`]: past twice the floor's.
const BEYOND: f32 = 3e-3;
/// (pass, layer, stage) of the tensor that is [`BEYOND`] the floor.
const BAD: (usize, usize, &str) = (1, 2, "mlp_out");

/// A model whose traced tensors are the reference's values times `1 ± error(pass, layer,
/// stage)` (the sign alternating by element), each layer passing its input on unchanged.
struct Model {
    error: fn(usize, usize, &str) -> f32,
    /// A stage of one layer not traced.
    skip: Option<(usize, &'static str)>,
    /// A stage of one layer traced with its last element cut off.
    short: Option<(usize, &'static str)>,
}

impl Model {
    fn exact() -> Self {
        Self {
            error: |_, _, _| 0.0,
            skip: None,
            short: None,
        }
    }

    fn floor() -> Self {
        Self {
            error: |_, _, _| FLOOR,
            ..Self::exact()
        }
    }

    fn other() -> Self {
        Self {
            error: |pass, layer, stage| {
                if (pass, layer, stage) == BAD {
                    BEYOND
                } else {
                    WITHIN
                }
            },
            ..Self::exact()
        }
    }

    /// The tensor this model traces for `stage` of `layer` in `pass`.
    fn tensor(&self, pass: usize, layer: usize, stage: &str) -> Vec<f32> {
        let error = (self.error)(pass, layer, stage);
        let offset = if stage == "mlp_out" { 0.25 } else { 0.0 };
        let mut values: Vec<f32> = (0..64)
            .map(|i| {
                let a = ((i as f32 + 1.0) * 0.37 + layer as f32 + pass as f32 * 0.5 + offset).sin()
                    + 2.0;
                let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
                a * (1.0 + sign * error)
            })
            .collect();
        if self.short == Some((layer, stage)) {
            values.pop();
        }
        values
    }

    #[allow(clippy::ptr_arg)]
    #[trace_layer(index = index)]
    fn block(&self, x: &Vec<f32>, index: usize, pass: usize) -> Vec<f32> {
        if self.skip != Some((index, "attn_out")) {
            let attn_out = self.tensor(pass, index, "attn_out");
            trace_tensor!("attn_out", &attn_out);
        }
        if self.skip != Some((index, "mlp_out")) {
            let mlp_out = self.tensor(pass, index, "mlp_out");
            trace_tensor!("mlp_out", &mlp_out);
        }
        x.clone()
    }

    #[trace_model(position = position)]
    fn forward(&self, position: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.1).cos()).collect();
        for layer in 0..LAYERS {
            x = self.block(&x, layer, position);
        }
        x
    }
}

/// [`PASSES`] passes of `model` into `dir/name`, every tensor captured, every layer fed the
/// inputs `isolate` captured if given.
fn write(dir: &Path, name: &str, model: &Model, isolate: Option<&str>) -> String {
    write_as(dir, name, model, true, isolate)
}

/// [`write`], captured only if `capture`.
fn write_as(dir: &Path, name: &str, model: &Model, capture: bool, isolate: Option<&str>) -> String {
    let path: PathBuf = dir.join(name);
    write_run(&path, capture, isolate.map(Path::new), || {
        for position in 0..PASSES {
            model.forward(position);
        }
    });
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The reference, the floor and the other, written into a scratch directory.
fn traces(name: &str) -> (PathBuf, [String; 3]) {
    let dir = scratch(name);
    let reference = write(&dir, "reference.ndjson", &Model::exact(), None);
    let floor = write(&dir, "floor.ndjson", &Model::floor(), None);
    let other = write(&dir, "other.ndjson", &Model::other(), None);
    (dir, [reference, floor, other])
}

fn json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let output = run(args);
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

fn place(value: &serde_json::Value) -> (u64, u64, &str) {
    (
        value["pass"].as_u64().expect("a pass"),
        value["layer"].as_u64().expect("a layer"),
        value["stage"].as_str().expect("a stage"),
    )
}

/// The smallest rtol at which every element of `b` is within `ATOL + rtol·|a_i|` of `a`'s.
fn least_rtol(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let (x, y) = (f64::from(x), f64::from(y));
            ((y - x).abs() - ATOL).max(0.0) / x.abs()
        })
        .fold(0.0, f64::max)
}

/// The same under `norm`: `(‖b − a‖ − √n·ATOL) / ‖a‖`.
fn least_norm_rtol(a: &[f32], b: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        diff += (y - x) * (y - x);
        norm += x * x;
    }
    ((diff.sqrt() - (a.len() as f64).sqrt() * ATOL) / norm.sqrt()).max(0.0)
}

/// Asserts that `said` says each of `expected`.
fn says(said: &str, expected: &[&str]) {
    for expected in expected {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
}

/// The number at `key` of `value`.
fn number(value: &serde_json::Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("a number at {key}: {value}"))
}

#[test]
fn the_floor_allows_k_times_its_error_and_no_more() {
    let (_dir, [reference, floor, other]) = traces("floor-captured");

    // The given rtol alone: the first tensor past it diverges.
    let (code, plain) = json(&["diff", "--json", &reference, &other]);
    assert_eq!(code, Some(1));
    assert_eq!(place(&plain["first_divergence"]), (0, 0, "attn_out"));
    assert!(plain["first_divergence"]["floor_rtol"].is_null());
    assert!(plain["first_divergence"]["allowed_rtol"].is_null());
    assert!(plain["floor"].is_null());

    // Twice the floor's error: only the tensor three times as far diverges, and it is the
    // first divergence, at its own place.
    let (code, floored) = json(&["diff", "--json", "--floor", &floor, &reference, &other]);
    assert_eq!(code, Some(1), "{floored}");
    let first = &floored["first_divergence"];
    assert_eq!(place(first), (BAD.0 as u64, BAD.1 as u64, BAD.2));
    assert_eq!(
        floored["compared"]["diverged"], 1,
        "{}",
        floored["compared"]
    );
    assert_eq!(floored["floor_factor"], 2.0);
    assert_eq!(floored["no_floor_count"], 0);

    // Its fields, computed from the values.
    let exact = Model::exact().tensor(BAD.0, BAD.1, BAD.2);
    let floor_rtol = least_rtol(&exact, &Model::floor().tensor(BAD.0, BAD.1, BAD.2));
    let other_rtol = least_rtol(&exact, &Model::other().tensor(BAD.0, BAD.1, BAD.2));
    assert!(close(number(first, "floor_rtol"), floor_rtol), "{first}");
    assert_eq!(first["floor_exact"], true);
    assert!(
        close(number(first, "allowed_rtol"), 2.0 * floor_rtol),
        "{first}"
    );
    assert!(close(number(first, "least_rtol"), other_rtol), "{first}");
    assert!(close(number(&first["tolerance"], "rtol"), 2.0 * floor_rtol));

    // The per-layer rows of the table's pass (the first divergence's): the floor's error of
    // each layer's worst tensor and the other's over it.
    assert_eq!(floored["table_pass"], 1);
    for row in floored["layers"].as_array().expect("layers") {
        let layer = row["layer"].as_u64().unwrap() as usize;
        let stage = row["worst"]["name"].as_str().unwrap();
        let exact = Model::exact().tensor(1, layer, stage);
        let floor_rtol = least_rtol(&exact, &Model::floor().tensor(1, layer, stage));
        let other_rtol = least_rtol(&exact, &Model::other().tensor(1, layer, stage));
        assert!(close(number(row, "floor_rtol"), floor_rtol), "{row}");
        assert!(
            close(number(row, "floor_ratio"), other_rtol / floor_rtol),
            "{row}"
        );
        assert!(close(
            number(&row["worst"], "allowed_rtol"),
            RTOL.max(2.0 * floor_rtol)
        ));
        let diverged = row["worst"]["verdict"] == "diverged";
        assert_eq!(diverged, layer == BAD.1, "{row}");
    }

    // Four times the floor's error: everything passes.
    let wide = [
        "diff",
        "--floor",
        &floor,
        "--floor-factor",
        "4",
        &reference,
        &other,
    ];
    let output = run(&wide);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    // The text: the floor named, the table with both errors, their ratio and the allowed rtol.
    let output = run(&["diff", "--floor", &floor, &reference, &other]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    let why = format!("is 2 times the floor's error {floor_rtol:.2e} (more than the given 1e-5)");
    says(
        &said,
        &[
            "floor:",
            "first divergence: pass 1, layer 2, mlp_out",
            &why,
            "floor rtol  other rtol  other/floor  allowed rtol",
        ],
    );
}

#[test]
fn summaries_bound_the_floor_and_judge_alike() {
    let (_dir, [reference, floor, other]) = traces("floor-summaries");
    let args = [
        "diff",
        "--summaries-only",
        "--floor",
        &floor,
        &reference,
        &other,
    ];
    let (code, value) = json(&[&args[..], &["--json"]].concat());
    assert_eq!(code, Some(1), "{value}");
    let first = &value["first_divergence"];
    assert_eq!(place(first), (BAD.0 as u64, BAD.1 as u64, BAD.2));
    assert_eq!(value["compared"]["diverged"], 1);
    // From summaries the floor's error is a lower bound on the captures', here nearly equal
    // (every element is off by the same fraction, the head and tail samples too).
    assert_eq!(first["floor_exact"], false);
    let exact = Model::exact().tensor(BAD.0, BAD.1, BAD.2);
    let floor_rtol = least_rtol(&exact, &Model::floor().tensor(BAD.0, BAD.1, BAD.2));
    let bound = number(first, "floor_rtol");
    assert!(
        bound <= floor_rtol * (1.0 + 1e-9) && bound > 0.9 * floor_rtol,
        "{bound} against {floor_rtol}"
    );
    let said = text(&run(&args));
    assert!(said.contains('≈'), "estimates are marked: {said}");

    // A floor bounded by summaries against another compared by captures: said.
    let dir = scratch("floor-unlike");
    let uncaptured = write_as(&dir, "floor.ndjson", &Model::floor(), false, None);
    let said = text(&run(&["diff", "--floor", &uncaptured, &reference, &other]));
    let expected = format!(
        "warning: {} compared tensors were compared by captures and the floor by summaries",
        2 * LAYERS * PASSES
    );
    assert!(said.contains(&expected), "{said}");

    // Under `norm` the floor's error is the norm's, captured.
    let args = [
        "diff",
        "--json",
        "--check-error-stat",
        "norm",
        "--floor",
        &floor,
        &reference,
        &other,
    ];
    let (_, value) = json(&args);
    let row = &value["layers"][0];
    let stage = row["worst"]["name"].as_str().unwrap();
    let pass = value["table_pass"].as_u64().unwrap() as usize;
    let exact = Model::exact().tensor(pass, 0, stage);
    let floor_rtol = least_norm_rtol(&exact, &Model::floor().tensor(pass, 0, stage));
    assert!(close(number(row, "floor_rtol"), floor_rtol), "{row}");
}

#[test]
fn tensors_without_a_floor_keep_the_given_rtol_and_are_named() {
    let dir = scratch("floor-missing");
    let reference = write(&dir, "reference.ndjson", &Model::exact(), None);
    let other = write(&dir, "other.ndjson", &Model::other(), None);
    let partial = Model {
        skip: Some((3, "mlp_out")),
        short: Some((1, "attn_out")),
        ..Model::floor()
    };
    let floor = write(&dir, "floor.ndjson", &partial, None);

    let (code, value) = json(&["diff", "--json", "--floor", &floor, &reference, &other]);
    assert_eq!(code, Some(1));
    // Judged by the given rtol, layer 1's attn_out (another shape in the floor) diverges first.
    let first = &value["first_divergence"];
    assert_eq!(place(first), (0, 1, "attn_out"));
    assert_eq!(first["no_floor"], "shape_mismatch");
    assert!(first["floor_rtol"].is_null());
    assert!(close(number(first, "allowed_rtol"), RTOL));
    assert_eq!(value["no_floor_count"], 2 * PASSES);
    let missing: Vec<(u64, u64, &str, &str)> = value["no_floor"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let at = (n["pass"].as_u64().unwrap(), n["layer"].as_u64().unwrap());
            (
                at.0,
                at.1,
                n["name"].as_str().unwrap(),
                n["why"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        missing.contains(&(0, 3, "mlp_out", "missing")),
        "{missing:?}"
    );
    assert!(
        missing.contains(&(1, 1, "attn_out", "shape_mismatch")),
        "{missing:?}"
    );
    let warnings = value["warnings"].to_string();
    assert!(
        warnings.contains("4 compared tensors have no floor"),
        "{warnings}"
    );

    let said = text(&run(&["diff", "--floor", &floor, &reference, &other]));
    says(
        &said,
        &[
            "warning: 4 compared tensors have no floor, judged by the given rtol:",
            "pass 0 layer.3.mlp_out (not in the floor)",
            "pass 0 layer.1.attn_out (another shape in the floor)",
        ],
    );
}

#[test]
fn the_floor_factor_needs_a_floor_and_a_positive_number() {
    let (_dir, [reference, floor, other]) = traces("floor-arguments");
    let alone = run(&["diff", "--floor-factor", "3", &reference, &other]);
    assert_eq!(alone.status.code(), Some(2));
    assert!(text(&alone).contains("--floor <FLOOR>"), "{}", text(&alone));
    for bad in ["0", "-1", "nan", "inf", "two"] {
        let factor = format!("--floor-factor={bad}");
        let output = run(&["diff", "--floor", &floor, &factor, &reference, &other]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(
            text(&output).contains("must be a finite number above 0"),
            "{}",
            text(&output)
        );
    }
    // A negative number after a space is the factor, not an unknown flag.
    let spaced = run(&[
        "diff",
        "--floor",
        &floor,
        "--floor-factor",
        "-1",
        &reference,
        &other,
    ]);
    assert!(
        text(&spaced).contains("must be a finite number above 0"),
        "{}",
        text(&spaced)
    );
    let report = run(&["report", &other, "--floor", &floor]);
    assert_eq!(report.status.code(), Some(2), "--floor needs --against");
}

#[test]
fn the_report_plots_the_floor_beside_the_trace() {
    let (dir, [reference, floor, other]) = traces("floor-report");
    let page = dir.join("page.html");
    let page_path = page.to_str().unwrap();
    let output = run(&[
        "report",
        &other,
        "--against",
        &reference,
        "--floor",
        &floor,
        "-o",
        page_path,
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let html = std::fs::read_to_string(&page).expect("the page");
    let data = embedded_data(&html);
    let diff = &data["diff"];
    let floor_data = &diff["floor"];
    assert_eq!(floor_data["factor"], 2.0);
    assert!(floor_data["path"]
        .as_str()
        .unwrap()
        .ends_with("floor.ndjson"));
    let stages: Vec<&str> = diff["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let pass = diff["curve_pass"].as_u64().unwrap() as usize;
    let at = stages.iter().position(|s| *s == "mlp_out").unwrap();
    for layer in 0..LAYERS {
        let exact = Model::exact().tensor(pass, layer, "mlp_out");
        let floor_rtol = least_rtol(&exact, &Model::floor().tensor(pass, layer, "mlp_out"));
        let other_rtol = least_rtol(&exact, &Model::other().tensor(pass, layer, "mlp_out"));
        let value = |key: &str| floor_data[key][at][layer].as_f64().unwrap();
        assert!(close(value("floor_rtols"), floor_rtol));
        assert!(close(value("rtols"), other_rtol));
        assert!(close(value("allowed_rtols"), RTOL.max(2.0 * floor_rtol)));
    }
    assert!(
        html.contains("diff-floor-ratio"),
        "the page draws the ratio"
    );

    // Without --floor the page has no floor data.
    let output = run(&["report", &other, "--against", &reference, "-o", page_path]);
    assert_eq!(output.status.code(), Some(1));
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    assert!(data["diff"]["floor"].is_null());
}

#[test]
fn an_isolated_run_is_judged_by_the_same_floor() {
    let (dir, [reference, floor, other]) = traces("floor-isolated");
    let isolated = write(&dir, "isolated.ndjson", &Model::other(), Some(&reference));
    let isolated = isolated.as_str();

    let (code, plain) = json(&["diff", "--json", &reference, &other, "--isolated", isolated]);
    assert_eq!(code, Some(1));
    assert_eq!(place(&plain["first_local_divergence"]), (0, 0, "attn_out"));
    let args = [
        "diff",
        "--json",
        "--floor",
        &floor,
        &reference,
        &other,
        "--isolated",
        isolated,
    ];
    let (code, floored) = json(&args);
    assert_eq!(code, Some(1));
    assert_eq!(
        place(&floored["first_local_divergence"]),
        (BAD.0 as u64, BAD.1 as u64, BAD.2)
    );
    let isolated_first = &floored["isolated"]["first_divergence"];
    assert!(isolated_first["allowed_rtol"].as_f64().unwrap() > RTOL);
}
