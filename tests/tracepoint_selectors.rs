//! Tracepoints that share a name are told apart: the listing shows, for each, the filter text
//! that selects it alone, and a session filtered by it records that tracepoint only.

use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session, TraceFilter};

struct Attention;
struct Mlp;
struct Model;

impl Attention {
    #[trace_layer]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter().map(|v| v * 0.5).collect()
    }
}

impl Mlp {
    #[trace_layer]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter().map(|v| v + 1.0).collect()
    }
}

impl Model {
    #[trace_model]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        Mlp.forward(&Attention.forward(x))
    }
}

/// The line of `fn forward` in the `impl` block of `owner`.
fn line_of(owner: &str) -> u32 {
    let source = include_str!("tracepoint_selectors.rs");
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|line| *line == format!("impl {owner} {{"))
        .expect("impl block");
    let offset = lines[start..]
        .iter()
        .position(|line| line.contains("fn forward"))
        .expect("fn forward");
    u32::try_from(start + offset + 1).expect("line fits")
}

#[test]
fn every_selector_selects_its_tracepoint_alone() {
    let all = model_trace::tracepoints();
    if !cfg!(feature = "enabled") {
        assert!(all.is_empty());
        return;
    }
    assert_eq!(all.len(), 3);
    for tracepoint in &all {
        let selector = tracepoint.selector();
        let filter = TraceFilter::parse(&selector).expect("a selector parses");
        let selected: Vec<_> = all.iter().filter(|tp| filter.admits(tp)).collect();
        assert_eq!(selected, [tracepoint], "{selector}");
        let listed = tracepoint.to_string();
        assert!(listed.contains(&format!("  {selector}  (")), "{listed}");
    }
    let selectors: Vec<String> = all.iter().map(|tp| tp.selector()).collect();
    let (attention, mlp) = (line_of("Attention"), line_of("Mlp"));
    assert_eq!(
        selectors,
        [
            "model:forward".to_owned(),
            format!("layer:forward@tracepoint_selectors.rs:{attention}"),
            format!("layer:forward@tracepoint_selectors.rs:{mlp}"),
        ]
    );
}

#[test]
fn a_session_filtered_by_file_and_line_records_that_layer_only() {
    let filter = format!("layer:forward@tracepoint_selectors.rs:{}", line_of("Mlp"));
    let session = Session::with_filter(ModelTracerConfig::lightweight(), &filter).unwrap();
    assert_eq!(Model.forward(&[2.0]), vec![2.0]);
    let tracer = session.finish();
    if cfg!(feature = "enabled") {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers.len(), 1, "{layers:?}");
        assert_eq!(layers[0].input_stats.mean, 1.0);
    }
}
