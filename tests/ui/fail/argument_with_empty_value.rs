use model_trace::trace_kv_cache;

struct Cache(Vec<f32>);

impl Cache {
    #[trace_kv_cache(len = , capacity = 4)]
    fn push(&mut self, v: f32) {
        self.0.push(v);
    }
}

fn main() {
    Cache(Vec::new()).push(1.0);
}
