//! `#[trace_attention]`: the returned probabilities, in the enclosing layer or at `layer`.
#![deny(warnings)]

use model_trace::{trace_attention, trace_layer, ModelTracerConfig, Session, TensorRef};

struct Attention {
    layer: usize,
}

impl Attention {
    /// `[heads = 1, q_len = 2, k_len = 2]`, causal.
    #[trace_attention(layer = self.layer, name = "attn_probs")]
    fn probs(&self) -> Vec<f32> {
        vec![1.0, 0.0, 0.25, 0.75]
    }
}

#[trace_attention]
fn shaped<'a>(data: &'a [f32], shape: &'a [usize]) -> Option<TensorRef<'a>> {
    TensorRef::new(data, shape).ok()
}

#[trace_layer(index = 4)]
fn layer() -> usize {
    let probs = [0.5, 0.5];
    shaped(&probs, &[1, 1, 2]).map_or(0, |_| 1)
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(Attention { layer: 2 }.probs().len(), 4);
    assert_eq!(layer(), 1);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers: Vec<_> = tracer
            .attention_traces()
            .iter()
            .map(|t| t.layer_idx)
            .collect();
        assert!(layers.contains(&2) && layers.contains(&4), "{layers:?}");
    }
}
