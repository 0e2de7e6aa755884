//! A generic parameter without the tensor bound compiles and is skipped, never an error.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn first<T: Clone>(items: &[T]) -> Option<T> {
    items.first().cloned()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(first(&["a", "b"]), Some("a"));
    assert_eq!(first::<u8>(&[]), None);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0].input_stats.count, 0);
        assert_eq!(layers[0].output_stats.count, 0);
    }
}
