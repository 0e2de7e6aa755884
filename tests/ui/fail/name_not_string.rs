use model_trace::trace_layer;

#[trace_layer(name = block)]
fn block(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    block(&[]);
}
