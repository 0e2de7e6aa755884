use model_trace::trace_logits;

#[trace_logits(layer = 3)]
fn head(x: &[f32]) -> () {
    let _ = x;
}

fn main() {
    head(&[]);
}
