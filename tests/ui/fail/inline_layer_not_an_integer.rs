use model_trace::trace_attention_value;

fn attend(probs: &[f32], layer: &str) {
    trace_attention_value!(probs, layer = layer);
}

fn main() {
    attend(&[1.0], "0");
}
