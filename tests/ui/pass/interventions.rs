//! What interventions need from the expansion: inputs and outputs a tracepoint may change,
//! and those it cannot, all compile in both builds without a warning. A value that cannot be
//! changed is a runtime error when an intervention asks, never a compile error.
#![deny(warnings)]

use model_trace::{trace_layer, trace_stage, Action, ModelTracerConfig, Session};

struct Block {
    bias: Vec<f32>,
}

impl Block {
    /// A borrowed input and an owned output: both can be changed.
    #[trace_layer]
    fn forward(&self, x: &Vec<f32>) -> Vec<f32> {
        let h: Vec<f32> = x.iter().zip(&self.bias).map(|(a, b)| a + b).collect();
        let h = trace_stage!("attn_out", h);
        h
    }

    /// The input is a field: it cannot be changed.
    #[trace_layer(input = &self.bias)]
    fn bias_only(&self) -> Vec<f32> {
        self.bias.clone()
    }
}

/// An owned input, already `mut`.
#[trace_layer]
fn owned(mut x: Vec<f32>) -> Vec<f32> {
    x.push(1.0);
    x
}

/// An output borrowed from the input: the input is not shadowed, so this still compiles.
#[trace_layer]
fn borrowed<'a>(x: &'a Vec<f32>, _scale: f32) -> &'a Vec<f32> {
    x
}

/// Generic and `impl` parameters, an unsized and a `&mut` one.
#[trace_layer]
fn generic<T: Clone>(x: &T, y: impl Into<f32>, z: &[f32], w: &mut Vec<f32>) -> T {
    w.push(y.into() + z.len() as f32);
    x.clone()
}

fn main() {
    let session = Session::builder(ModelTracerConfig::full())
        .intervene("layer=0..", Action::Scale(1.0))
        .start()
        .unwrap();
    let block = Block { bias: vec![1.0; 2] };
    assert_eq!(block.forward(&vec![1.0, 2.0]), [2.0, 3.0]);
    assert_eq!(block.bias_only(), [1.0, 1.0]);
    assert_eq!(owned(vec![0.0]), [0.0, 1.0]);
    let v = vec![3.0];
    assert_eq!(borrowed(&v, 1.0), &v);
    let mut w = Vec::new();
    assert_eq!(generic(&5_u8, 1.0_f32, &[0.0], &mut w), 5);
    let value = trace_stage!("outside", vec![1.0_f32]);
    assert_eq!(value, [1.0]);
    drop(session.finish_with_errors());
}
