//! Methods of a trait impl, and a trait's default method.
#![deny(warnings)]

use model_trace::{trace_layer, trace_logits, ModelTracerConfig, Session};

trait Module {
    fn forward(&self, x: &[f32]) -> Vec<f32>;

    #[trace_logits]
    fn head(&self, x: &[f32]) -> Vec<f32> {
        self.forward(x)
    }
}

struct Relu;

impl Module for Relu {
    #[trace_layer]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter().map(|v| v.max(0.0)).collect()
    }
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(Relu.head(&[-1.0, 2.0]), vec![0.0, 2.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(tracer.activation_traces()[0].layers.len(), 1);
        assert_eq!(tracer.logit_traces().len(), 1);
    }
}
