use model_trace::trace_layer;

#[trace_layer(index = "0")]
fn block(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    block(&[1.0]);
}
