use model_trace::trace_model;

#[trace_model]
async fn generate(prompt: Vec<f32>) -> Vec<f32> {
    prompt
}

fn main() {
    drop(generate(Vec::new()));
}
