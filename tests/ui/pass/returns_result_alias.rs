//! A candle-style alias with one type parameter; `.into()` in the tail still infers.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[derive(Debug, PartialEq)]
struct Error(String);

type Result<T> = std::result::Result<T, Error>;

#[trace_layer]
fn softmax(x: &[f32]) -> Result<Vec<f32>> {
    let sum: f32 = x.iter().map(|v| v.exp()).sum();
    if sum == 0.0 {
        return Err(Error("empty".to_owned()));
    }
    Ok(x.iter().map(|v| v.exp() / sum).collect::<Vec<_>>()).map(Into::into)
}

#[trace_layer]
fn total(x: &[f32]) -> Result<f64> {
    Ok(x.iter().sum::<f32>().into())
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(softmax(&[0.0, 0.0]), Ok(vec![0.5, 0.5]));
    assert_eq!(softmax(&[]), Err(Error("empty".to_owned())));
    assert_eq!(total(&[1.0, 2.0]), Ok(3.0));
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(
            tracer.activation_traces()[0].layers[0].output_stats.mean,
            0.5
        );
    }
}
