//! Inline macros for values without a function of their own: stages join the enclosing layer,
//! attention and logits take its index unless given `layer`.
#![deny(warnings)]

use model_trace::{
    trace_attention_value, trace_layer, trace_logits_value, trace_tensor, ModelTracerConfig,
    Session,
};

#[trace_layer(index = 5)]
fn block(x: &[f32]) -> Vec<f32> {
    let normed: Vec<f32> = x.iter().map(|v| v / 2.0).collect();
    trace_tensor!("attn_in", &normed);
    let probs = vec![0.5_f32, 0.5];
    trace_attention_value!(&probs);
    trace_attention_value!(probs, layer = 7_u8, name = "cross");
    let gate = vec![1.0_f32; 2];
    trace_tensor!("gate", gate);
    trace_logits_value!(&normed, layer = 5);
    normed
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(block(&[2.0, 4.0]), vec![1.0, 2.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layer = &tracer.activation_traces()[0].layers[0];
        assert_eq!(layer.stage("attn_in").map(|s| s.mean), Some(1.5));
        assert_eq!(layer.stages[1].0, "gate");
        let layers: Vec<_> = tracer
            .attention_traces()
            .iter()
            .map(|t| t.layer_idx)
            .collect();
        assert!(layers.contains(&5) && layers.contains(&7), "{layers:?}");
        let functions: Vec<_> = model_trace::tracepoints()
            .iter()
            .map(|tp| tp.function)
            .collect();
        assert!(functions.iter().all(|f| *f == "block"), "{functions:?}");
    }
}
