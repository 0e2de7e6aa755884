use model_trace::{trace_layer, trace_tensor};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    trace_tensor!("input", x);
    let y = x.to_vec();
    trace_tensor!("output", &y);
    y
}

fn main() {
    block(&[1.0]);
}
