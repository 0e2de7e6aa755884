//! A generic parameter bounded by the tensor trait is traced.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session, TraceTensor};

#[trace_layer]
fn identity<T: TraceTensor + Clone>(x: &T) -> T {
    x.clone()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(identity(&vec![1.0_f32, 3.0]), vec![1.0, 3.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layer = &tracer.activation_traces()[0].layers[0];
        assert_eq!(layer.input_stats.mean, 2.0);
        assert_eq!(layer.output_stats.mean, 2.0);
    }
}
