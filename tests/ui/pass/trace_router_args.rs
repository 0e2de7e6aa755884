//! `#[trace_router]` and `trace_router_value!` with every argument: arguments that only the
//! annotation reads (`bias`, `groups`) count as uses in both builds.
#![deny(warnings)]

use model_trace::{trace_layer, trace_router, trace_router_value, ModelTracerConfig, Session, TensorRef};

type Routing<'a> = (TensorRef<'a>, TensorRef<'a>, TensorRef<'a>);

struct Gate {
    bias: Vec<f32>,
    groups: usize,
    layer: u32,
}

impl Gate {
    /// One token, four experts in two groups, one group and two experts chosen.
    #[trace_router(scoring = sigmoid, bias = &self.bias, groups = (self.groups, 1), layer = self.layer, name = "gate")]
    fn route<'a>(&self, logits: &'a [f32], chosen: &'a [f32]) -> Option<Routing<'a>> {
        let logits = TensorRef::new(logits, &[1, 4]).ok()?;
        let weights = TensorRef::new(&[0.5, 0.5], &[1, 2]).ok()?;
        let experts = TensorRef::new(chosen, &[1, 2]).ok()?;
        Some((logits, weights, experts))
    }
}

#[trace_layer(index = 3)]
fn block(logits: &[f32]) -> usize {
    let weights = [0.6f32, 0.4];
    let experts = [1.0f32, 0.0];
    trace_router_value!(logits, &weights, &experts, scoring = softmax);
    logits.len()
}

fn main() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    let gate = Gate {
        bias: vec![0.0; 4],
        groups: 2,
        layer: 7,
    };
    assert!(gate.route(&[1.0, 2.0, 0.0, -1.0], &[1.0, 0.0]).is_some());
    assert_eq!(block(&[1.0, 2.0, 0.0, -1.0]), 4);
    let tracer = session.finish();
    if model_trace::ENABLED {
        let layers: Vec<usize> = tracer.routers().iter().map(|r| r.layer).collect();
        assert_eq!(layers, [7, 3]);
    }
}
