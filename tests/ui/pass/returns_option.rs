//! `Option<T>`: the `Some` value is the output.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn nonempty(x: &[f32]) -> Option<Vec<f32>> {
    (!x.is_empty()).then(|| x.to_vec())
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(nonempty(&[3.0]), Some(vec![3.0]));
    assert_eq!(nonempty(&[]), None);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers[0].output_stats.mean, 3.0);
        assert_eq!(layers[1].output_stats.count, 0);
    }
}
