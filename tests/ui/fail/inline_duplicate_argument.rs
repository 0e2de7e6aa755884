use model_trace::trace_logits_value;

fn main() {
    let logits = vec![0.5_f32, 0.5];
    trace_logits_value!(&logits, layer = 1, layer = 2);
}
