use model_trace::trace_attention;

#[trace_attention]
fn attention(scores: &mut [f32]) {
    scores.fill(0.5);
}

fn main() {
    attention(&mut [0.0; 2]);
}
