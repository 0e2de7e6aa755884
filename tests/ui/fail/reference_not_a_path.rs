use model_trace::trace_quant;

#[trace_quant(reference = |x: &[f32]| x.to_vec())]
fn quantized(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    quantized(&[]);
}
