//! A syntax error inside an annotated function is the compiler's error, reported once: the
//! macro hands the function back untouched instead of adding one of its own.
use model_trace::trace_layer;

#[trace_layer(index = 0)]
fn block(x: &[f32]) -> Vec<f32> {
    let scaled: Vec<f32> = x.iter().map(|v| v * 2.0).collect()
    scaled
}

fn main() {
    block(&[1.0]);
}
