use model_trace::trace_model;

#[trace_model(position)]
fn model(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    model(&[]);
}
