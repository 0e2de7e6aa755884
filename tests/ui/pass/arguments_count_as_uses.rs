//! Fields, methods, constants and parameters that only the macros' arguments use are used in
//! both builds: compiled out, the arguments are type-checked in a closure that is never called.
#![deny(warnings)]

use model_trace::{
    trace_attention_value, trace_kv_cache, trace_layer, trace_model, trace_quant,
    ModelTracerConfig, Session,
};

const HIT_RATE: f64 = 1.0;

struct KvCache {
    keys: Vec<f32>,
    max_len: usize,
    width: usize,
}

impl KvCache {
    fn bytes(&self) -> usize {
        self.keys.len() * self.width
    }

    #[trace_kv_cache(
        len = self.keys.len(),
        capacity = self.max_len,
        bytes = self.bytes(),
        hit_rate = HIT_RATE,
    )]
    fn append(&mut self, key: f32) {
        self.keys.push(key);
    }
}

struct Linear {
    weight: Vec<f32>,
}

impl Linear {
    fn f32_version(&self, x: &[f32]) -> Vec<f32> {
        x.iter().zip(&self.weight).map(|(a, w)| a * w).collect()
    }

    #[trace_quant(reference = Self::f32_version, quant = Q8_0)]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(&self.weight)
            .map(|(a, w)| a * w.round())
            .collect()
    }
}

#[trace_layer(index = layer, input = embedded)]
fn block(x: &[f32], layer: u16, embedded: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn attend(probs: &[f32], layer: u8) {
    trace_attention_value!(probs, layer = layer);
}

#[trace_model(position = pos)]
fn forward(linear: &Linear, cache: &mut KvCache, x: &[f32], pos: usize) -> Vec<f32> {
    cache.append(x[0]);
    attend(&[1.0], 0);
    block(&linear.forward(x), 0, x)
}

fn main() {
    let linear = Linear {
        weight: vec![1.5, 2.0],
    };
    let mut cache = KvCache {
        keys: Vec::new(),
        max_len: 16,
        width: 4,
    };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(forward(&linear, &mut cache, &[1.0, 1.0], 3), vec![2.0, 2.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        assert_eq!(tracer.activation_traces()[0].position, 3);
        let step = &tracer.kv_trace().steps[0];
        assert_eq!((step.capacity, step.cache_size_bytes), (16, 4));
        assert_eq!(tracer.quant_traces().len(), 1);
    }
}
