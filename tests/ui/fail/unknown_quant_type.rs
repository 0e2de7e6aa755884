use model_trace::trace_quant;

fn reference(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_quant(reference = reference, quant = Q3_1)]
fn quantized(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    quantized(&[]);
}
