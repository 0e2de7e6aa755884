use model_trace::trace_layer;

#[trace_layer(name = "block", index = 0, name = "layer")]
fn block(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    block(&[]);
}
