//! Named and elided lifetimes, in parameters and in the return type.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

struct View<'a> {
    data: &'a [f32],
}

impl<'a> View<'a> {
    #[trace_layer]
    fn head(&self, n: usize) -> &'a [f32] {
        &self.data[..n]
    }
}

#[trace_layer]
fn longer<'a, 'b: 'a>(a: &'a [f32], b: &'b [f32]) -> &'a [f32] {
    if a.len() >= b.len() {
        a
    } else {
        b
    }
}

#[trace_layer]
fn view(data: &[f32]) -> View<'_> {
    View { data }
}

fn main() {
    let data = [1.0, 2.0, 3.0];
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(view(&data).head(2), &[1.0, 2.0]);
    assert_eq!(longer(&data[..1], &data), &data);
    drop(session.finish());
}
