//! `Result<T, E>`: the `Ok` value is the output; an `Err` records no output.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn checked(x: &[f32]) -> Result<Vec<f32>, String> {
    if x.iter().any(|v| v.is_nan()) {
        Err("nan".to_owned())
    } else {
        Ok(x.iter().map(|v| v + 1.0).collect())
    }
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(checked(&[1.0]), Ok(vec![2.0]));
    assert!(checked(&[f32::NAN]).is_err());
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers[0].output_stats.mean, 2.0);
        assert_eq!(layers[1].output_stats.count, 0);
    }
}
