//! `#[trace_layer]` with `index`, `input` and `name`; without `index` layers are numbered by
//! call order within the pass.
#![deny(warnings)]

use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session};

struct Block {
    index: u8,
}

impl Block {
    #[trace_layer(index = self.index, input = &state.hidden, name = "block")]
    fn forward(&self, state: &State) -> Vec<f32> {
        state.hidden.iter().map(|v| v * 2.0).collect()
    }
}

struct State {
    hidden: Vec<f32>,
}

#[trace_layer]
fn numbered(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_model]
fn model(x: &[f32]) -> Vec<f32> {
    let h = numbered(&numbered(x));
    Block { index: 9 }.forward(&State { hidden: h })
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(model(&[1.0]), vec![2.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let indices: Vec<_> = tracer.activation_traces()[0]
            .layers
            .iter()
            .map(|l| l.layer_idx)
            .collect();
        assert_eq!(indices, vec![0, 1, 9]);
        assert_eq!(
            tracer.activation_traces()[0].layers[2].input_stats.mean,
            1.0
        );
    }
}
