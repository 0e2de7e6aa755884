//! An inherent method taking `&self`; `self` is never the input.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

struct Block {
    bias: Vec<f32>,
}

impl Block {
    #[trace_layer(index = 3)]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter().zip(&self.bias).map(|(a, b)| a + b).collect()
    }
}

fn main() {
    let block = Block {
        bias: vec![1.0, 1.0],
    };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(block.forward(&[0.0, 2.0]), vec![1.0, 3.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layer = &tracer.activation_traces()[0].layers[0];
        assert_eq!(layer.layer_idx, 3);
        assert_eq!(layer.input_stats.mean, 1.0);
        assert_eq!(layer.output_stats.mean, 2.0);
    }
}
