//! Two attributes on one function each register their own tracepoint.
#![deny(warnings)]

use model_trace::{trace_layer, trace_quant, ModelTracerConfig, Session};

fn exact(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v / 3.0).collect()
}

#[trace_layer]
#[trace_quant(reference = exact, quant = Q8_0)]
fn rounded(x: &[f32]) -> Vec<f32> {
    if x.is_empty() {
        return Vec::new();
    }
    x.iter()
        .map(|v| (v / 3.0 * 100.0).round() / 100.0)
        .collect()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(rounded(&[1.0, 2.0]), vec![0.33, 0.67]);
    assert_eq!(rounded(&[]), Vec::<f32>::new());
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(model_trace::tracepoints().len(), 2);
        assert_eq!(tracer.activation_traces()[0].layers.len(), 2);
        assert_eq!(tracer.quant_traces()[0].traces.len(), 2);
    }
}
