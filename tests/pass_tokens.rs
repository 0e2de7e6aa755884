//! `#[trace_model(tokens = EXPR)]`: the token ids a pass consumes, in its `pass_begin` event
//! when given and absent otherwise; read only when the pass is traced (never compiled out);
//! ids that cannot be read are an error of the pass, which begins without them. (A candle
//! tensor's ids: trace-runtime's unit tests, and the smollm and minilm examples.)
//!
//! Sessions are built with `Session::builder`, which reads no environment variable.

mod common;

use std::cell::Cell;

use model_trace::{
    trace_layer, trace_model, Event, ModelTracerConfig, PassBegin, PassTokens, RecordErrorKind,
    Session, TensorError, TokensError,
};

use common::Events;

fn start() -> (Session, Events) {
    let events = Events::default();
    let session = Session::builder(ModelTracerConfig::lightweight())
        .sink(events.clone())
        .start()
        .expect("an in-memory session cannot fail to start");
    (session, events)
}

fn pass_begins(events: &Events) -> Vec<PassBegin> {
    events.picked(|event| match event {
        Event::PassBegin(begin) => Some(begin.clone()),
        _ => None,
    })
}

#[trace_layer]
fn block(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * 2.0).collect()
}

thread_local! {
    static READS: Cell<usize> = const { Cell::new(0) };
}

/// `ids`, counting how often the macro asked for them.
fn counted(ids: &[u32]) -> &[u32] {
    READS.with(|reads| reads.set(reads.get() + 1));
    ids
}

fn reads() -> usize {
    READS.with(Cell::get)
}

#[trace_model(position = position, tokens = counted(ids))]
fn decode(ids: &[u32], position: usize) -> Vec<f32> {
    let embedded: Vec<f32> = ids.iter().map(|&id| id as f32).collect();
    block(&embedded)
}

#[trace_model]
fn untokenized(x: &[f32]) -> Vec<f32> {
    block(x)
}

#[test]
fn a_pass_given_tokens_writes_them_and_one_without_writes_none() {
    let (session, events) = start();
    decode(&[1, 9152, 28], 0);
    decode(&[42], 3);
    untokenized(&[1.0]);
    let (_, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let begins = pass_begins(&events);
    if !model_trace::ENABLED {
        assert!(begins.is_empty());
        return;
    }
    let tokens: Vec<_> = begins.iter().map(|b| b.tokens.clone()).collect();
    assert_eq!(tokens, [Some(vec![1, 9152, 28]), Some(vec![42]), None]);
    let line = serde_json::to_string(&Event::PassBegin(begins[1].clone())).unwrap();
    assert!(line.ends_with(r#""tokens":[42]}"#), "{line}");
    let line = serde_json::to_string(&Event::PassBegin(begins[2].clone())).unwrap();
    assert!(!line.contains(r#""tokens""#), "{line}");
}

#[test]
fn tokens_are_read_once_a_traced_pass_and_never_otherwise() {
    let before = reads();
    decode(&[1, 2], 0);
    assert_eq!(
        reads(),
        before,
        "no session: the expression is not evaluated"
    );
    let (session, _) = start();
    decode(&[1, 2], 0);
    decode(&[3], 2);
    drop(session.finish());
    let expected = if model_trace::ENABLED { 2 } else { 0 };
    assert_eq!(reads() - before, expected);
}

/// A user's ids that fail to read with the error they hold.
struct Failing(TokensError);

impl PassTokens for &Failing {
    fn token_ids(self) -> Result<Vec<u32>, TokensError> {
        Err(self.0.clone())
    }
}

#[trace_model(tokens = ids)]
fn decode_failing(ids: &Failing, x: &[f32]) -> Vec<f32> {
    let _ = ids;
    block(x)
}

#[trace_model(tokens = ids)]
fn decode_i64(ids: &[i64], x: &[f32]) -> Vec<f32> {
    let _ = ids;
    block(x)
}

#[test]
fn ids_that_cannot_be_read_are_an_error_of_the_pass_which_begins_without_them() {
    let (session, events) = start();
    let lost = TokensError::Read(TensorError::Backend("device lost".into()));
    decode_failing(&Failing(lost), &[1.0]);
    decode_i64(&[7, -1], &[1.0]);
    let cube = TokensError::Rank {
        shape: vec![1, 1, 2],
    };
    decode_failing(&Failing(cube), &[1.0]);
    let (tracer, errors) = session.finish_with_errors();
    if !model_trace::ENABLED {
        assert!(errors.is_empty());
        return;
    }
    let messages: Vec<(RecordErrorKind, &str)> = errors
        .iter()
        .map(|error| (error.kind, error.message.as_str()))
        .collect();
    assert_eq!(
        messages,
        [
            (
                RecordErrorKind::Read,
                "tokens: token ids could not be read: tensor backend error: device lost"
            ),
            (
                RecordErrorKind::Read,
                "tokens: token id -1 is not in 0..=4294967295"
            ),
            (
                RecordErrorKind::Shape,
                "tokens: token ids are read as [seq] or [batch, seq], not a tensor of shape \
                 [1, 1, 2]"
            ),
        ]
    );
    // Each error belongs to its pass, which was traced in full without its tokens.
    let passes: Vec<_> = events.errors().iter().map(|error| error.pass).collect();
    assert_eq!(passes, [Some(0), Some(1), Some(2)]);
    assert!(pass_begins(&events).iter().all(|b| b.tokens.is_none()));
    assert_eq!(tracer.activation_traces().len(), 3);
    assert!(tracer
        .activation_traces()
        .iter()
        .all(|p| p.layers.len() == 1));
}
