//! Functions that return nothing: a layer records its input only; a KV-cache step is read
//! after the body.
#![deny(warnings)]

use model_trace::{trace_kv_cache, trace_layer, ModelTracerConfig, Session};

struct Cache {
    keys: Vec<f32>,
}

impl Cache {
    #[trace_layer]
    fn check(&self, x: &[f32]) {
        assert!(x.len() <= 4);
    }

    #[trace_kv_cache(len = self.keys.len())]
    fn push(&mut self, key: f32) {
        if self.keys.len() == 2 {
            return;
        }
        self.keys.push(key);
    }
}

fn main() {
    let mut cache = Cache { keys: Vec::new() };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    cache.check(&[1.0]);
    for key in [1.0, 2.0, 3.0] {
        cache.push(key);
    }
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(
            tracer.activation_traces()[0].layers[0].input_stats.mean,
            1.0
        );
        let steps = &tracer.kv_trace().steps;
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[2].valid_positions, 2);
    }
}
