use model_trace::{trace_layer, trace_tensor};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    let y = x.to_vec();
    trace_tensor!(post_norm, &y);
    y
}

fn main() {
    block(&[]);
}
