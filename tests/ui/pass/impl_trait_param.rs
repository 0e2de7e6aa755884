//! `impl Trait` parameters: bounded by the tensor trait they are traced, otherwise skipped.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session, TraceTensor};

#[trace_layer]
fn sum(values: impl IntoIterator<Item = f32>, x: &impl TraceTensor) -> f32 {
    let _ = x.shape();
    values.into_iter().sum()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(sum(vec![1.0, 2.0], &vec![4.0_f32]), 3.0);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(
            tracer.activation_traces()[0].layers[0].input_stats.mean,
            4.0
        );
    }
}
