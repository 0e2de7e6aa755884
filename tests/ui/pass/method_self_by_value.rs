//! A method consuming `self`; the body moves out of it.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

struct Weights {
    values: Vec<f32>,
}

impl Weights {
    #[trace_layer(input = &self.values)]
    fn into_doubled(self) -> Vec<f32> {
        self.values.into_iter().map(|v| v * 2.0).collect()
    }

    #[trace_layer]
    fn into_inner(self: Box<Self>) -> Vec<f32> {
        self.values
    }
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(
        Weights {
            values: vec![1.0, 2.0]
        }
        .into_doubled(),
        vec![2.0, 4.0]
    );
    assert_eq!(
        Box::new(Weights { values: vec![5.0] }).into_inner(),
        vec![5.0]
    );
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers[0].input_stats.mean, 1.5);
        assert_eq!(layers[0].output_stats.mean, 3.0);
        assert_eq!(layers[1].output_stats.mean, 5.0);
    }
}
