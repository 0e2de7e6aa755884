//! `#[trace_model]` with `position` (any integer type) and `name`, and without arguments.
#![deny(warnings)]

use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_model(position = start + 1, name = "decoder")]
fn decode(x: &[f32], start: u32) -> Vec<f32> {
    assert!(start < 100);
    block(&block(x))
}

#[trace_model]
fn encode(x: &[f32]) -> Vec<f32> {
    block(x)
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(decode(&[1.0], 6), vec![1.0]);
    assert_eq!(encode(&[1.0]), vec![1.0]);
    let tracer = session.finish();
    let names: Vec<_> = model_trace::tracepoints()
        .iter()
        .map(|tp| tp.name)
        .collect();
    if !names.is_empty() {
        assert!(names.contains(&"decoder") && names.contains(&"encode"));
        let passes = tracer.activation_traces();
        assert_eq!(passes[0].position, 7);
        assert_eq!(passes[0].layers.len(), 2);
        assert_eq!(passes[1].layers.len(), 1);
    }
}
