//! Early `return` from loops and branches records the returned value; a `return` inside a
//! closure, an async block or a nested function stays theirs.
#![deny(warnings)]

use model_trace::{trace_layer, ModelTracerConfig, Session};

#[trace_layer]
fn clip(x: &[f32], limit: f32) -> Vec<f32> {
    for v in x {
        if *v > limit {
            return vec![limit; x.len()];
        }
    }
    let positive = |v: f32| -> f32 {
        if v < 0.0 {
            return 0.0;
        }
        v
    };
    fn negate(v: f32) -> f32 {
        return -v;
    }
    let _future = async {
        return 1_u8;
    };
    match x.first() {
        Some(first) if *first == 0.0 => return x.iter().map(|v| negate(*v)).collect(),
        _ => {}
    }
    x.iter().map(|v| positive(*v)).collect()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(clip(&[1.0, 9.0], 5.0), vec![5.0, 5.0]);
    assert_eq!(clip(&[-1.0, 2.0], 5.0), vec![0.0, 2.0]);
    assert_eq!(clip(&[0.0, 2.0], 5.0), vec![-0.0, -2.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers[0].output_stats.mean, 5.0);
        assert_eq!(layers[1].output_stats.mean, 1.0);
        assert_eq!(layers[2].output_stats.mean, -1.0);
    }
}
