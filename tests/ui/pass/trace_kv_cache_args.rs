//! `#[trace_kv_cache]` with every argument, read after the body with `self` in scope and cast
//! from whatever integer or float type the cache uses.
#![deny(warnings)]

use model_trace::{trace_kv_cache, ModelTracerConfig, Session};

struct Cache {
    keys: Vec<f32>,
    capacity: u32,
    evicted: u64,
    hits: u32,
    lookups: u32,
}

impl Cache {
    #[trace_kv_cache(
        len = self.keys.len(),
        capacity = self.capacity,
        bytes = self.keys.len() * std::mem::size_of::<f32>(),
        evictions = self.evicted,
        hit_rate = f64::from(self.hits) / f64::from(self.lookups),
        name = "kv",
    )]
    fn append(&mut self, key: f32) -> usize {
        self.lookups += 1;
        if self.keys.len() as u32 == self.capacity {
            self.keys.remove(0);
            self.evicted += 1;
        } else {
            self.hits += 1;
        }
        self.keys.push(key);
        self.keys.len()
    }
}

fn main() {
    let mut cache = Cache {
        keys: Vec::new(),
        capacity: 2,
        evicted: 0,
        hits: 0,
        lookups: 0,
    };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    let lens: Vec<usize> = (0..3).map(|i| cache.append(i as f32)).collect();
    assert_eq!(lens, vec![1, 2, 2]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let steps = &tracer.kv_trace().steps;
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[2].valid_positions, 2);
        assert_eq!(steps[2].capacity, 2);
        assert_eq!(steps[2].cache_size_bytes, 8);
        assert_eq!(steps[2].evictions_this_step, 1);
        assert!((steps[2].cache_hit_rate.unwrap() - 2.0 / 3.0).abs() < 1e-6);
    }
}
