//! An inherent method taking `&mut self`, which the body mutates.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

struct Accumulator {
    total: Vec<f32>,
}

impl Accumulator {
    #[trace_layer]
    fn add(&mut self, x: &[f32]) -> &[f32] {
        for (t, v) in self.total.iter_mut().zip(x) {
            *t += v;
        }
        &self.total
    }
}

fn main() {
    let mut acc = Accumulator {
        total: vec![0.0; 2],
    };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(acc.add(&[1.0, 2.0]), &[1.0, 2.0]);
    assert_eq!(acc.add(&[1.0, 2.0]), &[2.0, 4.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[1].layer_idx, 1);
        assert_eq!(layers[1].output_stats.mean, 3.0);
    }
}
