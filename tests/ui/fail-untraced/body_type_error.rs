//! A type error inside an annotated function lands on the user's token, once.
use model_trace::trace_layer;

#[trace_layer(index = 0)]
fn block(x: &[f32]) -> Vec<f32> {
    let scale: f32 = "2";
    x.iter().map(|v| v * scale).collect()
}

fn main() {
    block(&[1.0]);
}
