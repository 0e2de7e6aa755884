use model_trace::trace_model;

#[trace_model(tokens = ids)]
fn forward(x: &[f32], ids: Vec<u32>) -> Vec<f32> {
    assert!(!ids.is_empty());
    x.to_vec()
}

fn main() {
    forward(&[1.0], vec![1]);
}
