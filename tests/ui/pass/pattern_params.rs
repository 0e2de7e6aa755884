//! Parameters bound by patterns (tuples, `_`) are skipped when looking for the input.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

struct Pair(f32, f32);

#[trace_layer]
fn combine((a, b): (f32, f32), _: u8, Pair(c, d): Pair, x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * a + b + c + d).collect()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(combine((2.0, 0.0), 0, Pair(0.0, 1.0), &[1.0]), vec![3.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(
            tracer.activation_traces()[0].layers[0].input_stats.mean,
            1.0
        );
    }
}
