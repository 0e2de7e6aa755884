// The function takes its input by value (as burn code does) and the reference a borrow: the
// reference is called with a clone of the function's own type, so the mismatch is the plain one.
use model_trace::trace_quant;

fn reference(x: &Vec<f32>) -> Vec<f32> {
    x.clone()
}

#[trace_quant(reference = reference)]
fn quantized(x: Vec<f32>) -> Vec<f32> {
    x
}

fn main() {
    quantized(vec![1.0]);
}
