use model_trace::trace_model;

#[trace_model(tokens = &weights)]
fn forward(x: &[f32], weights: Vec<f32>) -> Vec<f32> {
    x.iter().zip(&weights).map(|(a, w)| a * w).collect()
}

fn main() {
    forward(&[1.0], vec![0.5]);
}
