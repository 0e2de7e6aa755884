//! An inline macro's tracepoint names the innermost annotated function around it (closures
//! included), and no function outside any.
#![deny(warnings)]

use model_trace::{trace_layer, trace_logits_value, trace_model, trace_tensor};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    let y: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    trace_tensor!("attn_in", &y);
    let finish = |v: &Vec<f32>| {
        trace_tensor!("in_closure", v);
        v.clone()
    };
    finish(&y)
}

fn unannotated(x: &[f32]) {
    trace_logits_value!(x, name = "outside");
}

#[trace_model]
fn forward(x: &[f32]) -> Vec<f32> {
    #[trace_layer(name = "inner")]
    fn inner(x: &[f32]) -> Vec<f32> {
        trace_tensor!("nested", x);
        x.to_vec()
    }
    trace_logits_value!(x, name = "after_inner");
    unannotated(x);
    block(&inner(x))
}

#[trace_layer]
#[trace_model(name = "stacked_model")]
fn stacked(x: &[f32]) -> Vec<f32> {
    trace_tensor!("under_two", x);
    x.to_vec()
}

fn main() {
    assert_eq!(forward(&[1.0]), vec![2.0]);
    assert_eq!(stacked(&[1.0]), vec![1.0]);
    let tracepoints = model_trace::tracepoints();
    if tracepoints.is_empty() {
        return;
    }
    let function = |name: &str| {
        let tracepoint = tracepoints.iter().find(|tp| tp.name == name);
        tracepoint.map(|tp| tp.function)
    };
    assert_eq!(function("attn_in"), Some("block"));
    assert_eq!(function("in_closure"), Some("block"));
    assert_eq!(function("nested"), Some("inner"));
    assert_eq!(function("after_inner"), Some("forward"));
    assert_eq!(function("outside"), Some(""));
    assert_eq!(function("under_two"), Some("stacked"));
}
