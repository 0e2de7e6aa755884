//! The tolerance `diff` chooses when none is given, from the pair of precisions the two headers
//! state (`metadata.precision`, else the dtype text): the same F32 weights, the norm criterion
//! at rtol 1e-4; quantized weights on either side, norm at 0.15; floats of other types or a
//! header that does not say, the built-in elementwise 1e-5; always said, and any flag given
//! wins. The traces here differ from the reference by a known relative error per element, so
//! the verdict each choice gives is known.

mod common;

use std::path::Path;

use model_trace::{trace_layer, trace_model, trace_tensor, Precision};
use serde_json::Value;

use common::{embedded_data, run, scratch, text, write_session};

const LAYERS: usize = 3;

/// A model whose traced tensors are the reference's values times `1 ± error(layer)`, the sign
/// alternating by element.
struct Model {
    error: fn(usize) -> f32,
}

impl Model {
    fn tensor(&self, layer: usize, stage: &str) -> Vec<f32> {
        let offset = if stage == "mlp_out" { 0.25 } else { 0.0 };
        (0..64)
            .map(|i| {
                let a = ((i as f32 + 1.0) * 0.37 + layer as f32 + offset).sin() + 2.0;
                let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
                a * (1.0 + sign * (self.error)(layer))
            })
            .collect()
    }

    #[allow(clippy::ptr_arg)]
    #[trace_layer(index = index)]
    fn block(&self, x: &Vec<f32>, index: usize) -> Vec<f32> {
        trace_tensor!("attn_out", &self.tensor(index, "attn_out"));
        trace_tensor!("mlp_out", &self.tensor(index, "mlp_out"));
        x.clone()
    }

    #[trace_model]
    fn forward(&self) {
        let mut x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.1).cos()).collect();
        for layer in 0..LAYERS {
            x = self.block(&x, layer);
        }
    }
}

/// What a trace's header says of its precision.
#[derive(Clone, Default)]
struct Header {
    precision: Option<Precision>,
    dtype: Option<&'static str>,
}

fn transformers_f32() -> Header {
    Header {
        precision: Some(Precision::float("F32").source("transformers")),
        dtype: None,
    }
}

fn port_quantized() -> Precision {
    Precision::quantized(["Q4_K", "Q6_K"])
        .activations("F32")
        .source("the port")
}

fn with(precision: Precision) -> Header {
    Header {
        precision: Some(precision),
        dtype: None,
    }
}

/// The model with `error` into `dir/name`, captured, its header saying `header`.
fn write(dir: &Path, name: &str, header: &Header, error: fn(usize) -> f32) -> String {
    let path = dir.join(name);
    let config = model_trace::ModelTracerConfig::lightweight();
    let header = header.clone();
    write_session(
        &path,
        config,
        |mut builder| {
            builder = builder.capture("*");
            if let Some(precision) = header.precision {
                builder = builder.precision(precision);
            }
            if let Some(dtype) = header.dtype {
                builder = builder.dtype(dtype);
            }
            builder
        },
        || Model { error }.forward(),
    );
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// `diff --json REFERENCE OTHER ARGS...`: the exit code and the report.
fn diff_json(reference: &str, other: &str, args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["diff", "--json", reference, other];
    all.extend(args);
    let output = run(&all);
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

/// The tolerance line of `diff`'s text and the lines under it that say where it came from.
fn tolerance_lines(reference: &str, other: &str, args: &[&str]) -> String {
    let mut all = vec!["diff", reference, other];
    all.extend(args);
    let out = text(&run(&all));
    let lines: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("tolerance:"))
        .take_while(|l| l.starts_with("tolerance:") || l.starts_with("  "))
        .collect();
    assert!(!lines.is_empty(), "{out}");
    lines.join("\n")
}

/// 5% off on every tensor: the quantization's noise, far past float rounding.
fn quantization_noise(_: usize) -> f32 {
    0.05
}

/// 3e-5 off on every tensor: past the built-in elementwise 1e-5 (for values near 2), within
/// the same-weights norm 1e-4.
fn float_rounding(_: usize) -> f32 {
    3e-5
}

/// 5e-4 off on every tensor: llama.cpp's GELU through its f16 table, past the same-weights
/// 1e-4, within llama.cpp's 1e-3.
fn gelu_through_f16(_: usize) -> f32 {
    5e-4
}

#[test]
fn each_pair_of_precisions_chooses_its_tolerance_and_says_why() {
    let dir = scratch("tolerance-pairs");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    let dequantized = port_quantized().dequantized_to("F32");
    let cases = [
        // (other's header, its error, rule, atol, rtol, criterion, exit code, reason says)
        (
            with(port_quantized()),
            quantization_noise as fn(usize) -> f32,
            "quantized",
            1e-5,
            0.15,
            "norm",
            0,
            "quantized weights (the other: Q4_K, Q6_K weights; F32 activations (the port))",
        ),
        (
            with(dequantized),
            float_rounding,
            "same_float_weights",
            0.0,
            1e-4,
            "norm",
            0,
            "the same float weights (F32 weights (transformers); Q4_K, Q6_K weights \
             dequantized to F32; F32 activations (the port)): float rounding",
        ),
        (
            with(
                Precision::float("F32")
                    .activations("F32")
                    .kv_cache("F32")
                    .source("llama.cpp"),
            ),
            gelu_through_f16,
            "same_float_weights_llama_cpp",
            0.0,
            1e-3,
            "norm",
            0,
            "the same float weights, one side llama.cpp (F32 weights (transformers); F32 \
             weights; F32 activations; F32 KV cache (llama.cpp)): float rounding, and \
             llama.cpp's GELU rounded through an f16 table",
        ),
        (
            with(Precision::float("BF16")),
            float_rounding,
            "no_measured_default",
            1e-5,
            1e-5,
            "elementwise",
            1,
            "no measured default for F32 weights against BF16",
        ),
        (
            with(Precision::float("F32").kv_cache("F16").source("llama.cpp")),
            float_rounding,
            "no_measured_default",
            1e-5,
            1e-5,
            "elementwise",
            1,
            "no measured default for F32 weights with a KV cache in F16",
        ),
        (
            Header::default(),
            float_rounding,
            "precision_unknown",
            1e-5,
            1e-5,
            "elementwise",
            1,
            "the other's header does not say its precision (metadata.precision): the built-in \
             default",
        ),
    ];
    for (at, (header, error, rule, atol, rtol, stat, code, reason)) in cases.into_iter().enumerate()
    {
        let other = write(&dir, &format!("other{at}.ndjson"), &header, error);
        let (exit, report) = diff_json(&reference, &other, &[]);
        let choice = &report["tolerance_choice"];
        assert_eq!(choice["rule"], rule, "{report:#}");
        assert_eq!(report["tolerance"]["default"]["atol"], atol, "{rule}");
        assert_eq!(report["tolerance"]["default"]["rtol"], rtol, "{rule}");
        assert_eq!(report["tolerance"]["error_stat"], stat, "{rule}");
        assert_eq!(exit, Some(code), "{rule}: {:#}", report["first_divergence"]);
        let said = choice["reason"].as_str().unwrap();
        assert!(said.contains(reason), "{rule}: {said}");
        assert_eq!(choice["reference_precision"]["weights"][0], "F32");
        assert_eq!(
            choice["other_precision"]["weights"],
            header.precision.map_or(Value::Null, |p| p.weights.into())
        );
        let lines = tolerance_lines(&reference, &other, &[]);
        assert!(lines.contains(reason), "{lines}");
        let chosen = [
            "quantized",
            "same_float_weights",
            "same_float_weights_llama_cpp",
        ]
        .contains(&rule);
        assert_eq!(
            lines.contains("\n  chosen from the headers: "),
            chosen,
            "{lines}"
        );
        println!("{rule}:\n{lines}\n");
    }
    // Neither header says: the same built-in default, said of both.
    let plain = write(&dir, "plain.ndjson", &Header::default(), |_| 0.0);
    let (_, report) = diff_json(&plain, &plain, &[]);
    let said = report["tolerance_choice"]["reason"].as_str().unwrap();
    assert_eq!(
        said,
        "the headers do not say their precision (metadata.precision): the built-in default"
    );
}

#[test]
fn the_quantized_default_notes_what_it_does_not_cover() {
    let dir = scratch("tolerance-quantized-note");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    // The reference quantized counts too (either side).
    let other = write(
        &dir,
        "other.ndjson",
        &transformers_f32(),
        quantization_noise,
    );
    let quantized = write(&dir, "q.ndjson", &with(port_quantized()), |_| 0.0);
    let (code, report) = diff_json(&quantized, &other, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(report["tolerance_choice"]["rule"], "quantized");
    let note = report["tolerance_choice"]["note"].as_str().unwrap();
    assert!(note.contains("decode passes can go further"), "{note}");
    let lines = tolerance_lines(&reference, &quantized, &[]);
    assert!(
        lines.contains("\n  note: decode passes can go further"),
        "{lines}"
    );
}

/// 2e-3 off on every tensor: a small bug, past float rounding, within any quantization noise.
fn small_bug(_: usize) -> f32 {
    2e-3
}

#[test]
fn a_quantized_pair_is_loose_only_between_implementations_or_weights() {
    let dir = scratch("tolerance-quantized-pairs");
    let port = write(&dir, "port.ndjson", &with(port_quantized()), |_| 0.0);
    // The same port on the same quantized weights (a refactor, a batch, another thread count):
    // no quantization noise between the runs, so a small bug must not pass as noise.
    let bugged = write(&dir, "bugged.ndjson", &with(port_quantized()), small_bug);
    let (code, report) = diff_json(&port, &bugged, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "no_measured_default");
    let said = report["tolerance_choice"]["reason"].as_str().unwrap();
    assert!(
        said.starts_with("the same quantized weights in the same implementation"),
        "{said}"
    );
    assert_eq!(code, Some(1), "{said}");
    // Another implementation on the same file (llama.cpp), or other types: the noise.
    let llama = Precision::quantized(["Q4_K", "Q6_K"]).source("llama.cpp");
    let other_kernels = write(&dir, "llama.ndjson", &with(llama), quantization_noise);
    let (code, report) = diff_json(&port, &other_kernels, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "quantized");
    assert_eq!(code, Some(0));
    let q8 = Precision::quantized(["Q8_0"]).source("the port");
    let other_types = write(&dir, "q8.ndjson", &with(q8), quantization_noise);
    let (_, report) = diff_json(&port, &other_types, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "quantized");
    // A quantized run against a header that says nothing: nothing assumed, the strict default.
    let unsaid = write(&dir, "unsaid.ndjson", &Header::default(), small_bug);
    let (code, report) = diff_json(&port, &unsaid, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "precision_unknown");
    assert_eq!(code, Some(1));
}

#[test]
fn a_type_name_that_is_neither_float_nor_ggml_is_never_taken_for_quantized() {
    let dir = scratch("tolerance-unknown-type");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    for (weights, rule) in [
        ("fp32", "same_float_weights"),
        ("float8_e4m3fn", "no_measured_default"),
    ] {
        let precision = Precision::quantized(["Q4_K"]).dequantized_to(weights);
        let other = write(
            &dir,
            &format!("{weights}.ndjson"),
            &with(precision),
            small_bug,
        );
        let (code, report) = diff_json(&reference, &other, &[]);
        assert_eq!(report["tolerance_choice"]["rule"], rule, "{weights}");
        assert_eq!(code, Some(1), "{weights}: a 2e-3 bug must not pass");
    }
}

#[test]
fn f32_weights_dequantized_from_other_types_are_not_the_same_weights() {
    let dir = scratch("tolerance-other-files");
    let q4 = Precision::quantized(["Q4_K", "Q6_K"]).dequantized_to("F32");
    let q8 = Precision::quantized(["Q8_0"]).dequantized_to("F32");
    let reference = write(&dir, "q4.ndjson", &with(q4.clone()), |_| 0.0);
    let other = write(&dir, "q8.ndjson", &with(q8), float_rounding);
    let (_, report) = diff_json(&reference, &other, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "no_measured_default");
    let said = report["tolerance_choice"]["reason"].as_str().unwrap();
    assert!(
        said.contains("dequantized from other types (Q4_K, Q6_K against Q8_0)"),
        "{said}"
    );
    // The same file's types on both sides: the same weights.
    let same = write(&dir, "q4b.ndjson", &with(q4), float_rounding);
    let (code, report) = diff_json(&reference, &same, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "same_float_weights");
    assert_eq!(code, Some(0));
}

#[test]
fn any_tolerance_flag_given_wins_over_the_headers() {
    let dir = scratch("tolerance-given");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    let other = write(
        &dir,
        "q.ndjson",
        &with(port_quantized()),
        quantization_noise,
    );
    let (code, _) = diff_json(&reference, &other, &[]);
    assert_eq!(code, Some(0), "the headers' default passes it");
    for (flags, rtol, stat) in [
        (&["--rtol", "0.01"][..], 0.01, "elementwise"),
        (&["--check-error-stat", "norm"][..], 1e-5, "norm"),
        (&["--atol", "layer.9.*:1"][..], 1e-5, "elementwise"),
    ] {
        let (code, report) = diff_json(&reference, &other, flags);
        assert_eq!(report["tolerance_choice"]["rule"], "given", "{flags:?}");
        assert_eq!(report["tolerance"]["default"]["rtol"], rtol, "{flags:?}");
        assert_eq!(report["tolerance"]["error_stat"], stat, "{flags:?}");
        assert_eq!(code, Some(1), "{flags:?}");
        assert_eq!(
            report["tolerance_choice"]["reference_precision"],
            Value::Null
        );
    }
    let lines = tolerance_lines(&reference, &other, &["--rtol", "0.01"]);
    assert_eq!(
        lines,
        "tolerance: atol 1e-5, rtol 1e-2; elementwise criterion\n  \
         given (--rtol, --atol, --check-error-stat)"
    );
}

#[test]
fn an_older_header_is_read_from_its_dtype_text_and_says_so() {
    let dir = scratch("tolerance-dtype-text");
    let text_header = |dtype| Header {
        precision: None,
        dtype: Some(dtype),
    };
    // A text that names no weights says nothing: against it, nothing is assumed.
    let unsaid = write(&dir, "unsaid.ndjson", &text_header("f32"), |_| 0.0);
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    let quantized = text_header("Q4_1 and Q8_0 weights, f32 activations");
    let other = write(&dir, "q.ndjson", &quantized, quantization_noise);
    let (code, report) = diff_json(&reference, &other, &[]);
    assert_eq!(code, Some(0), "{report:#}");
    let choice = &report["tolerance_choice"];
    assert_eq!(choice["rule"], "quantized");
    let said = choice["reason"].as_str().unwrap();
    assert!(
        said.contains(
            "\"Q4_1 and Q8_0 weights, f32 activations\", read from the header's dtype text"
        ),
        "{said}"
    );
    assert_eq!(choice["other_precision"], Value::Null);
    let (code, report) = diff_json(&unsaid, &other, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "precision_unknown");
    assert_eq!(code, Some(1));
    // A dequantized port's text against a structured F32 reference: the same float weights.
    let reference = write(&dir, "f32.ndjson", &transformers_f32(), |_| 0.0);
    let dequantized = text_header("f32 weights dequantized from Q4_1 and Q8_0, f32 activations");
    let other = write(&dir, "deq.ndjson", &dequantized, float_rounding);
    let (code, report) = diff_json(&reference, &other, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "same_float_weights");
    assert_eq!(code, Some(0));
    // The structured precision wins over the text.
    let both = Header {
        precision: Some(Precision::float("F32")),
        dtype: Some("Q4_1 weights"),
    };
    let other = write(&dir, "both.ndjson", &both, float_rounding);
    let (_, report) = diff_json(&reference, &other, &[]);
    assert_eq!(report["tolerance_choice"]["rule"], "same_float_weights");
}

#[test]
fn a_divergence_at_the_start_under_the_same_weights_hints_at_other_weights() {
    let dir = scratch("tolerance-weights-hint");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    let dequantized = with(port_quantized().dequantized_to("F32"));
    let hint = "the weights may not be the same";
    let early: fn(usize) -> f32 = |layer| if layer == 0 { 1e-2 } else { 0.0 };
    let late: fn(usize) -> f32 = |layer| if layer == 2 { 1e-2 } else { 0.0 };
    for (name, error, layer, hinted) in [("early", early, 0, true), ("late", late, 2, false)] {
        let other = write(&dir, &format!("{name}.ndjson"), &dequantized, error);
        let output = run(&["diff", &reference, &other]);
        let out = text(&output);
        assert_eq!(output.status.code(), Some(1), "{out}");
        let first = format!("first divergence: pass 0, layer {layer}, attn_out");
        assert!(out.contains(&first), "{out}");
        assert_eq!(out.contains(hint), hinted, "{out}");
    }
    let early = dir.join("early.ndjson");
    let early = early.to_str().unwrap();
    // Under a tolerance that assumes nothing of the weights, no hint.
    let output = run(&["diff", &reference, early, "--rtol", "1e-4"]);
    assert!(!text(&output).contains(hint));
}

#[test]
fn report_against_and_the_floor_choose_alike() {
    let dir = scratch("tolerance-report");
    let reference = write(&dir, "ref.ndjson", &transformers_f32(), |_| 0.0);
    let floor = write(&dir, "floor.ndjson", &with(port_quantized()), |_| 0.01);
    let other = write(
        &dir,
        "q.ndjson",
        &with(port_quantized()),
        quantization_noise,
    );
    let (code, report) = diff_json(&reference, &other, &["--floor", &floor]);
    assert_eq!(report["tolerance_choice"]["rule"], "quantized");
    assert_eq!(code, Some(0));
    let page = dir.join("page.html");
    let page_arg = page.to_str().unwrap();
    let output = run(&["report", &other, "--against", &reference, "-o", page_arg]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    let diff_text = data["diff"]["text"].as_str().unwrap();
    assert!(
        diff_text.contains("tolerance: atol 1e-5, rtol 1.5e-1; norm criterion\n  chosen from the headers: quantized weights"),
        "{diff_text}"
    );
}
