//! The `model-trace` command on trace files written by a small annotated model: what `list`
//! and `summary` say, and `diff`'s verdicts, JSON and exit codes (0 matched, 1 diverged, 2 bad
//! input).

mod common;

use std::path::{Path, PathBuf};

use model_trace::{trace_layer, trace_model, trace_tensor, ModelTracerConfig, Session};

use common::{embedded_data, run, scratch, text};

/// A model whose third stage can be broken on purpose.
struct Model {
    scale: f32,
    /// Reverses the order of `mlp_out`'s values in layer 1: statistics unchanged.
    reverse: bool,
}

impl Model {
    #[trace_layer]
    fn block(&self, x: &[f32], index: usize) -> Vec<f32> {
        let attn_out: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v * self.scale + i as f32 * 0.01).tanh())
            .collect();
        trace_tensor!("attn_out", &attn_out);
        let mut mlp_out: Vec<f32> = attn_out.iter().map(|v| v * 0.5 - 0.1).collect();
        if self.reverse && index == 1 {
            mlp_out.reverse();
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

fn write_trace(dir: &Path, name: &str, model: &Model, capture: Option<&str>) -> PathBuf {
    let path = dir.join(name);
    let mut builder = Session::builder(ModelTracerConfig::lightweight()).trace_file(&path);
    if let Some(capture) = capture {
        builder = builder.capture(capture);
    }
    let session = builder.start().expect("the trace file can be created");
    for position in 0..2 {
        model.forward(position);
    }
    session.finish();
    path
}

#[test]
fn list_and_summary_describe_a_trace() {
    let dir = scratch("list");
    let path = write_trace(
        &dir,
        "a.ndjson",
        &Model {
            scale: 1.0,
            reverse: false,
        },
        None,
    );
    let path = path.to_str().unwrap();
    let list = run(&["list", path]);
    assert!(list.status.success(), "{}", text(&list));
    let listed = text(&list);
    for expected in [
        "schema 3",
        "passes: 2 (positions 0, 1)",
        "layer 6",
        "pass_end 2",
        "record errors: none",
    ] {
        assert!(listed.contains(expected), "{expected:?} not in\n{listed}");
    }
    // Each tracepoint is listed by the pattern that selects it alone, as the header gives it.
    let header = std::fs::read_to_string(path).unwrap();
    let header: serde_json::Value = serde_json::from_str(header.lines().next().unwrap()).unwrap();
    let tracepoints = header["tracepoints"].as_array().unwrap();
    assert!(!tracepoints.is_empty());
    for tp in tracepoints {
        let (kind, selector) = (tp["kind"].as_str().unwrap(), tp["selector"].as_str());
        let selector = selector.unwrap_or_else(|| panic!("no selector in {tp}"));
        let line = format!("  {kind:<9}  {selector}  (");
        assert!(listed.contains(&line), "{line:?} not in\n{listed}");
    }
    let summary = run(&["summary", path]);
    assert!(summary.status.success(), "{}", text(&summary));
    let summarized = text(&summary);
    assert!(summarized.contains("Forward passes: 2"), "{summarized}");
    assert!(summarized.contains("layer  calls"), "{summarized}");
}

#[test]
fn diff_finds_what_statistics_cannot_see_and_says_where() {
    let dir = scratch("diff");
    let reference = write_trace(
        &dir,
        "reference.ndjson",
        &Model {
            scale: 1.0,
            reverse: false,
        },
        None,
    );
    let same = write_trace(
        &dir,
        "same.ndjson",
        &Model {
            scale: 1.0,
            reverse: false,
        },
        None,
    );
    let reversed = write_trace(
        &dir,
        "reversed.ndjson",
        &Model {
            scale: 1.0,
            reverse: true,
        },
        None,
    );
    let (reference, same, reversed) = (
        reference.to_str().unwrap(),
        same.to_str().unwrap(),
        reversed.to_str().unwrap(),
    );

    let identical = run(&["diff", reference, same]);
    assert_eq!(identical.status.code(), Some(0), "{}", text(&identical));
    assert!(
        text(&identical).contains("no divergence"),
        "{}",
        text(&identical)
    );

    let diverged = run(&["diff", reference, reversed]);
    assert_eq!(diverged.status.code(), Some(1), "{}", text(&diverged));
    let said = text(&diverged);
    assert!(
        said.contains("first divergence: pass 0, layer 1, mlp_out"),
        "{said}"
    );

    let json = run(&["diff", "--json", reference, reversed]);
    assert_eq!(json.status.code(), Some(1));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    let first = &value["first_divergence"];
    assert_eq!(
        (
            first["pass"].as_u64(),
            first["layer"].as_u64(),
            first["stage"].as_str()
        ),
        (Some(0), Some(1), Some("mlp_out"))
    );
    // The statistics cannot see a reordering; the sketch and the samples do.
    let failing: Vec<&str> = first["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["difference"].as_f64() > c["allowed"].as_f64())
        .filter_map(|c| c["what"].as_str())
        .collect();
    assert!(
        failing.iter().any(|w| w.starts_with("sketch[")),
        "{failing:?}"
    );
    for statistic in ["mean", "std", "l2_norm", "min", "max", "nan_count"] {
        assert!(!failing.contains(&statistic), "{statistic} in {failing:?}");
    }
    let clean = run(&["diff", "--json", reference, same]);
    let value: serde_json::Value = serde_json::from_slice(&clean.stdout).expect("JSON");
    assert!(value["first_divergence"].is_null());

    // a loose enough tolerance on that stage alone lets it pass
    let loose = run(&[
        "diff",
        "--atol",
        "layer.1.*:10",
        "--atol",
        "layer.2.*:10",
        reference,
        reversed,
    ]);
    assert_eq!(loose.status.code(), Some(0), "{}", text(&loose));
}

#[test]
fn captured_tensors_are_compared_value_by_value() {
    let dir = scratch("captured");
    let reference = write_trace(
        &dir,
        "reference.ndjson",
        &Model {
            scale: 1.0,
            reverse: false,
        },
        Some("*"),
    );
    let other = write_trace(
        &dir,
        "other.ndjson",
        &Model {
            scale: 1.0001,
            reverse: false,
        },
        Some("*"),
    );
    let (reference, other) = (reference.to_str().unwrap(), other.to_str().unwrap());
    let strict = run(&["diff", reference, other]);
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict));
    let said = text(&strict);
    assert!(
        said.contains("first divergence: pass 0, layer 0, attn_out"),
        "{said}"
    );
    assert!(said.contains("value by value"), "{said}");
    assert!(said.contains("NMSE"), "{said}");
    let tolerant = run(&["diff", "--rtol", "1e-3", "--atol", "1e-4", reference, other]);
    assert_eq!(tolerant.status.code(), Some(0), "{}", text(&tolerant));
}

#[test]
fn bad_input_exits_2_naming_the_file_and_line() {
    let dir = scratch("bad");
    let good = write_trace(
        &dir,
        "good.ndjson",
        &Model {
            scale: 1.0,
            reverse: false,
        },
        None,
    );
    let good = good.to_str().unwrap();
    let missing = run(&["diff", good, "/nonexistent/trace.ndjson"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing).contains("/nonexistent/trace.ndjson"),
        "{}",
        text(&missing)
    );

    let broken = dir.join("broken.ndjson");
    let mut lines: Vec<String> = std::fs::read_to_string(good)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines[2] = "{\"event\":\"layer\",\"seq\":\"x\"}".to_owned();
    std::fs::write(&broken, lines.join("\n") + "\n").unwrap();
    let malformed = run(&["summary", broken.to_str().unwrap()]);
    assert_eq!(malformed.status.code(), Some(2));
    assert!(
        text(&malformed).contains("broken.ndjson:3:"),
        "{}",
        text(&malformed)
    );

    let option = run(&["diff", "--atol", "lots", good, good]);
    assert_eq!(option.status.code(), Some(2));
    assert!(text(&option).contains("--atol"), "{}", text(&option));
    let usage = run(&["diff", good]);
    assert_eq!(
        usage.status.code(),
        Some(2),
        "clap's usage errors exit 2 too"
    );
}

#[test]
fn events_of_an_unknown_kind_are_passed_over_and_said() {
    let dir = scratch("unknown-kind");
    let model = Model {
        scale: 1.0,
        reverse: false,
    };
    let good = write_trace(&dir, "good.ndjson", &model, None);
    let newer = dir.join("newer.ndjson");
    let mut lines: Vec<String> = std::fs::read_to_string(&good)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let future = r#"{"event":"from_the_future","seq":1000,"pass":0}"#.to_owned();
    lines.insert(2, future.clone());
    lines.insert(3, future);
    std::fs::write(&newer, lines.join("\n") + "\n").unwrap();
    for command in ["summary", "list"] {
        let read = run(&[command, newer.to_str().unwrap()]);
        assert_eq!(read.status.code(), Some(0), "{}", text(&read));
        assert!(
            text(&read).contains("newer.ndjson: 2 `from_the_future` events not read"),
            "{}",
            text(&read)
        );
    }
    let same = run(&["diff", good.to_str().unwrap(), newer.to_str().unwrap()]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    assert!(text(&same).contains("not read"), "{}", text(&same));
}

#[test]
fn report_is_one_page_with_its_data_and_the_diff() {
    let dir = scratch("report");
    let model = |reverse| Model {
        scale: 1.0,
        reverse,
    };
    let reference = write_trace(&dir, "reference.ndjson", &model(false), None);
    let reversed = write_trace(&dir, "reversed.ndjson", &model(true), None);
    let page = dir.join("page.html");
    let (reference, reversed, page_arg) = (
        reference.to_str().unwrap(),
        reversed.to_str().unwrap(),
        page.to_str().unwrap(),
    );

    let alone = run(&["report", reference, "-o", page_arg]);
    assert_eq!(alone.status.code(), Some(0), "{}", text(&alone));
    assert!(
        text(&alone).contains("2 passes, 3 layers"),
        "{}",
        text(&alone)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    // self-contained: nothing is fetched (the SVG namespace URI is a name, not a request)
    for outside in [
        "<script src",
        "<link",
        "src=\"http",
        "href=\"http",
        "url(",
        "@import",
        "fetch(",
    ] {
        assert!(!html.contains(outside), "{outside} in the page");
    }
    let data = embedded_data(&html);
    assert_eq!(data["passes"].as_array().unwrap().len(), 2);
    assert_eq!(data["layers"], 3);
    let stages: Vec<&str> = data["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert_eq!(stages, ["input", "attn_out", "mlp_out", "output"]);
    assert!(data["diff"].is_null());
    // [shown pass][layer][stage][4 statistics] as little-endian f32, base64
    assert_eq!(
        data["stats"].as_str().unwrap().len(),
        (2 * 3 * 4 * 4 * 4usize).div_ceil(3) * 4
    );

    let against = run(&["report", reversed, "--against", reference, "-o", page_arg]);
    assert_eq!(against.status.code(), Some(1), "{}", text(&against));
    assert!(
        text(&against).contains("first divergence from")
            && text(&against).contains("pass 0, layer 1, mlp_out"),
        "{}",
        text(&against)
    );
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    let diff = &data["diff"];
    assert_eq!(diff["first"]["layer"], 1);
    assert_eq!(diff["curve_pass"], 0);
    let mlp = diff["stages"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s == "mlp_out")
        .unwrap();
    let ratios = diff["ratios"][mlp].as_array().unwrap();
    assert!(
        ratios[0].as_f64().unwrap() <= 1.0 && ratios[1].as_f64().unwrap() > 1.0,
        "{ratios:?}"
    );

    let missing = run(&["report", "/nonexistent/trace.ndjson"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing).contains("/nonexistent/trace.ndjson"),
        "{}",
        text(&missing)
    );
}

#[test]
fn report_data_cannot_close_its_script_element() {
    let dir = scratch("report-escape");
    let path = dir.join("t.ndjson");
    let session = Session::builder(ModelTracerConfig::lightweight())
        .trace_file(&path)
        .metadata(model_trace::RunMetadata {
            prompt: Some("</script><script>alert(1)</script>".to_owned()),
            ..model_trace::RunMetadata::default()
        })
        .start()
        .expect("the trace file can be created");
    Model {
        scale: 1.0,
        reverse: false,
    }
    .forward(0);
    session.finish();
    let page = dir.join("t.html");
    let out = run(&[
        "report",
        path.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(
        html.matches("</script>").count(),
        2,
        "only the two script elements close"
    );
    let data = embedded_data(&html);
    assert_eq!(
        data["metadata"]["prompt"],
        "</script><script>alert(1)</script>"
    );
}
