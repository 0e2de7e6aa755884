use model_trace::trace_quant;

#[trace_quant(quant = Q4_1)]
fn quantized(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    quantized(&[]);
}
