use model_trace::{trace_attention_value, trace_layer};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    let probs = vec![1.0_f32];
    trace_attention_value!(&probs, head = 0);
    x.to_vec()
}

fn main() {
    block(&[]);
}
