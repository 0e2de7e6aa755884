//! `unsafe fn` and an `extern "C"` ABI keep their qualifiers.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

/// # Safety
/// `x` must not be empty.
#[trace_layer]
unsafe fn first(x: &[f32]) -> f32 {
    unsafe { *x.get_unchecked(0) }
}

#[trace_layer]
extern "C" fn twice(x: f32) -> f32 {
    x * 2.0
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    // SAFETY: one element.
    assert_eq!(unsafe { first(&[4.0]) }, 4.0);
    assert_eq!(twice(2.0), 4.0);
    drop(session.finish());
}
