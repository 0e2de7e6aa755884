//! `mut` parameters keep their binding; the input is probed before the body changes it.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn scale(mut x: Vec<f32>, factor: f32) -> Vec<f32> {
    for v in &mut x {
        *v *= factor;
    }
    x
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(scale(vec![1.0, 2.0], 10.0), vec![10.0, 20.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layer = &tracer.activation_traces()[0].layers[0];
        assert_eq!(layer.input_stats.mean, 1.5);
        assert_eq!(layer.output_stats.mean, 15.0);
    }
}
