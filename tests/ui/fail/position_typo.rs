//! A misspelt variable in an argument is an error in both builds, not only with tracing on.
use model_trace::trace_model;

#[trace_model(position = poss)]
fn forward(x: &[f32], pos: usize) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    forward(&[1.0], 0);
}
