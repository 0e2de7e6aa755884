//! `#[trace_model(tokens = ...)]` with every kind of ids it takes: a slice, a borrowed `Vec` of
//! another integer type, an array, a field only the argument uses. Compiled out, the field
//! counts as used and the expression is never evaluated.
#![deny(warnings)]

use std::cell::Cell;

use model_trace::{trace_layer, trace_model, Event, ModelTracerConfig, Session};

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_model(position = start, tokens = ids)]
fn decode(x: &[f32], ids: &[u32], start: usize) -> Vec<f32> {
    block(x)
}

#[trace_model(tokens = &ids)]
fn encode(x: &[f32], ids: Vec<i64>) -> Vec<f32> {
    block(x)
}

#[trace_model(tokens = [7_u8, 8])]
fn constant(x: &[f32]) -> Vec<f32> {
    block(x)
}

struct Prompt {
    /// Read only by the `tokens` argument.
    ids: Vec<u32>,
    evaluated: Cell<bool>,
}

impl Prompt {
    fn ids(&self) -> &[u32] {
        self.evaluated.set(true);
        &self.ids
    }

    #[trace_model(tokens = self.ids())]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        block(x)
    }
}

fn main() {
    let session = Session::builder(ModelTracerConfig::lightweight())
        .sink(Passes::default())
        .start()
        .unwrap();
    decode(&[1.0], &[1, 9152], 4);
    encode(&[1.0], vec![101, 2023, 102]);
    constant(&[1.0]);
    let prompt = Prompt {
        ids: vec![5, 6],
        evaluated: Cell::new(false),
    };
    prompt.forward(&[1.0]);
    let (_, errors) = session.finish_with_errors();
    assert!(errors.is_empty());
    assert_eq!(prompt.evaluated.get(), model_trace::ENABLED);
    let tokens = TOKENS.with(|tokens| tokens.take());
    if model_trace::ENABLED {
        let expected: [&[u32]; 4] = [&[1, 9152], &[101, 2023, 102], &[7, 8], &[5, 6]];
        assert_eq!(tokens, expected.map(|ids| Some(ids.to_vec())));
    } else {
        assert!(tokens.is_empty());
    }
}

thread_local! {
    static TOKENS: Cell<Vec<Option<Vec<u32>>>> = const { Cell::new(Vec::new()) };
}

/// Keeps each pass's tokens.
#[derive(Default)]
struct Passes;

impl model_trace::TraceSink for Passes {
    fn name(&self) -> std::borrow::Cow<'_, str> {
        "passes".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), model_trace::SinkError> {
        if let Event::PassBegin(begin) = event {
            TOKENS.with(|tokens| {
                let mut kept = tokens.take();
                kept.push(begin.tokens.clone());
                tokens.set(kept);
            });
        }
        Ok(())
    }
}
