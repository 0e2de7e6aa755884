use model_trace::trace_layer;

#[trace_layer]
const fn width() -> usize {
    576
}

fn main() {
    let _ = width();
}
