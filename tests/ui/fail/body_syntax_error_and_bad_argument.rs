//! A function that does not parse yet still has its arguments checked: their errors, and the
//! compiler's own error for the body, each once.
use model_trace::trace_layer;

#[trace_layer(idx = 0)]
fn block(x: &[f32]) -> Vec<f32> {
    let scaled: Vec<f32> = x.iter().map(|v| v * 2.0).collect()
    scaled
}

fn main() {
    block(&[1.0]);
}
