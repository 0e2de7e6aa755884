//! A macro of the user's own that shares a name with an inline macro is left alone inside an
//! annotated function.
#![deny(warnings)]

use model_trace::trace_layer;

macro_rules! trace_tensor {
    ($name:literal, $value:expr) => {
        ($name, $value.len())
    };
}

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    let (name, len) = trace_tensor!("scaled", x);
    assert_eq!((name, len), ("scaled", 2));
    x.to_vec()
}

fn main() {
    assert_eq!(block(&[1.0, 2.0]), vec![1.0, 2.0]);
}
