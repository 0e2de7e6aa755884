//! `#[trace_logits]`: the returned logits at `layer`, or the final layer by default.
#![deny(warnings)]

use model_trace::{trace_logits, trace_model, ModelTracerConfig, Session};

#[trace_logits(layer = 0, name = "early_exit")]
fn early(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * 0.5).collect()
}

#[trace_logits]
fn head(x: &[f32]) -> Result<Vec<f32>, String> {
    Ok(x.to_vec())
}

#[trace_model(position = 0)]
fn model(x: &[f32]) -> Result<Vec<f32>, String> {
    early(x);
    head(x)
}

fn main() {
    let mut config = ModelTracerConfig::full();
    config.tracked_tokens = Some(vec![1]);
    let session = Session::with_filter(config, "").unwrap();
    assert_eq!(model(&[0.1, 0.9, 0.3]), Ok(vec![0.1, 0.9, 0.3]));
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let token = &tracer.logit_traces()[0].tracked_tokens[0];
        assert_eq!(token.token_id, 1);
        assert_eq!(token.final_rank(), Some(0));
    }
}
