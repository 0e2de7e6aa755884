//! Generic parameters with a `where` clause and a const generic.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn pad<T, const N: usize>(x: [T; N], fill: T) -> Vec<T>
where
    T: Copy + Default,
{
    let mut out = x.to_vec();
    out.push(fill);
    out
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(pad([1.0_f32, 2.0], 0.0), vec![1.0, 2.0, 0.0]);
    drop(session.finish());
}
