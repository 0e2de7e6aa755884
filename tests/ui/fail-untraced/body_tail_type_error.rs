//! A tail expression of the wrong type is the compiler's error on the user's token, once; the
//! traced build keeps the value in a `let` annotated with the return type, so the notes differ.
use model_trace::trace_layer;

#[trace_layer(index = 0)]
fn block(x: &[f32]) -> Vec<f32> {
    x
}

fn main() {
    block(&[1.0]);
}
