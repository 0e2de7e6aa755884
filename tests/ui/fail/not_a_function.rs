use model_trace::trace_layer;

#[trace_layer]
pub struct Block {
    weight: Vec<f32>,
}

fn main() {
    let block = Block { weight: Vec::new() };
    let _ = block.weight;
}
