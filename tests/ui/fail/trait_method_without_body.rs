use model_trace::trace_layer;

trait Module {
    #[trace_layer]
    fn forward(&self, x: &[f32]) -> Vec<f32>;
}

fn main() {}
