//! A free function; the first tensor argument is the input, the return value the output.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn block(step: usize, x: &[f32]) -> Vec<f32> {
    #![allow(clippy::cast_precision_loss)]
    x.iter().map(|v| v + step as f32).collect()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(block(1, &[1.0, 2.0]), vec![2.0, 3.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layer = &tracer.activation_traces()[0].layers[0];
        assert_eq!(layer.layer_idx, 0);
        assert_eq!(layer.input_stats.mean, 1.5);
        assert_eq!(layer.output_stats.mean, 2.5);
    }
}
