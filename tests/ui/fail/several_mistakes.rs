use model_trace::trace_layer;

#[trace_layer(idx = 1, name = 2, index)]
const fn block(x: usize) -> usize {
    x
}

fn main() {
    let _ = block(1);
}
