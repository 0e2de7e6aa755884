//! `impl Trait` in the return type: the output is kept without a type annotation.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

fn double(v: &f32) -> f32 {
    v * 2.0
}

#[trace_layer]
fn doubled(x: &[f32]) -> impl Iterator<Item = f32> + '_ {
    if x.is_empty() {
        return x.iter().map(double);
    }
    x.iter().map(double)
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(doubled(&[1.0, 2.0]).collect::<Vec<_>>(), vec![2.0, 4.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(tracer.activation_traces()[0].layers[0].input_stats.count, 2);
    }
}
