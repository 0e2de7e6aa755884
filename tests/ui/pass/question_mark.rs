//! `?` leaves the function directly: no output is recorded, the layer is still closed.
#![deny(warnings)]

use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session};

fn parse(text: &str) -> Result<f32, std::num::ParseFloatError> {
    text.parse()
}

#[trace_layer]
fn layer(x: &[f32], text: &str) -> Result<Vec<f32>, std::num::ParseFloatError> {
    let offset = parse(text)?;
    Ok(x.iter().map(|v| v + offset).collect())
}

#[trace_model]
fn model(x: &[f32], text: &str) -> Result<Vec<f32>, std::num::ParseFloatError> {
    let h = layer(x, text)?;
    layer(&h, text)
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(model(&[1.0], "1"), Ok(vec![3.0]));
    assert!(model(&[1.0], "x").is_err());
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), 2);
        assert_eq!(passes[0].layers.len(), 2);
        assert_eq!(passes[1].layers.len(), 1);
        assert_eq!(passes[1].layers[0].output_stats.count, 0);
    }
}
