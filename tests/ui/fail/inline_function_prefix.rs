//! Inline macros take no hidden syntax: the function they are in comes from the runtime.
use model_trace::trace_tensor;

fn block(x: &[f32]) {
    trace_tensor!(@function "other"; "attn_in", x);
}

fn main() {
    block(&[1.0]);
}
