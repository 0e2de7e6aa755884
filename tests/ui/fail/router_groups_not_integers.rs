use model_trace::trace_router;

#[trace_router(groups = (8.0, 4))]
fn route(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

fn main() {
    route(&[]);
}
