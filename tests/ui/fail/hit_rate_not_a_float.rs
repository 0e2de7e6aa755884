use model_trace::trace_kv_cache;

struct Cache {
    hits: u32,
}

impl Cache {
    #[trace_kv_cache(hit_rate = self.hits)]
    fn lookup(&mut self) {
        self.hits += 1;
    }
}

fn main() {
    Cache { hits: 0 }.lookup();
}
