//! `trace_stage!` returns the value to go on with: dropping it is a `must_use` warning.
#![deny(unused_must_use)]

use model_trace::{trace_layer, trace_stage};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    let h = x.to_vec();
    trace_stage!("attn_out", h.clone());
    h
}

fn main() {
    block(&[1.0]);
}
