//! What a session reports when a tracepoint cannot record: attention and logits of a shape it
//! cannot read, a stage outside any layer, tensors whose values cannot be read, a quantized
//! output and a reference of different lengths, and how errors are counted (one entry per
//! tracepoint, kind and message, at most `MAX_DISTINCT_ERRORS` of them). Each case is read
//! where a user reads it: `Session::finish_with_errors`, and the `error` and `session_end`
//! events that every sink (the trace file among them) receives.
//!
//! Sessions are built with `Session::builder`, which reads no environment variable.
#![cfg(feature = "enabled")]

mod common;

use std::borrow::Cow;

use model_trace::{
    trace_attention, trace_layer, trace_logits, trace_model, trace_quant, trace_tensor, Event,
    ModelTracer, ModelTracerConfig, RecordError, RecordErrorKind, Session, TensorError,
    TraceTensor, MAX_DISTINCT_ERRORS,
};

use common::Events;

fn start(config: ModelTracerConfig) -> (Session, Events) {
    let events = Events::default();
    let session = Session::builder(config)
        .sink(events.clone())
        .start()
        .expect("an in-memory session cannot fail to start");
    (session, events)
}

fn full() -> ModelTracerConfig {
    ModelTracerConfig::full()
}

/// The one error of a session, with what every error must say.
fn only_error(errors: &[RecordError]) -> &RecordError {
    assert_eq!(errors.len(), 1, "{errors:#?}");
    &errors[0]
}

fn tracepoint_name(error: &RecordError) -> &'static str {
    error.tracepoint.map_or("", |tp| tp.name)
}

/// A tensor type whose shape is whatever it says, unchecked against its values: a user's
/// tensor with a bug in `shape()`, or an honest tensor of an unusual rank.
struct Claimed {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Claimed {
    fn new(shape: &[usize], data: &[f32]) -> Self {
        Claimed {
            shape: shape.to_vec(),
            data: data.to_vec(),
        }
    }
}

impl TraceTensor for Claimed {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(&self.data))
    }
}

/// A device tensor whose values cannot be brought back.
struct Unreadable {
    shape: Vec<usize>,
}

impl TraceTensor for Unreadable {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "bf16"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Err(TensorError::Backend("device lost".to_owned()))
    }
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

#[trace_attention(layer = 0)]
fn attention_of(shape: &[usize], data: &[f32]) -> Claimed {
    Claimed::new(shape, data)
}

#[test]
fn attention_without_a_key_dimension_is_a_shape_error() {
    let (session, events) = start(full());
    let probs = attention_of(&[], &[1.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(probs.data, [1.0], "the value is returned untouched");
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Shape);
    assert_eq!(tracepoint_name(error), "attention_of");
    assert!(error.message.contains("[]"), "{}", error.message);
    assert_eq!(error.occurrences, 1);
    assert!(tracer.attention_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Attention(_))), 0);
    let reported = events.errors();
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].kind, RecordErrorKind::Shape);
    assert_eq!(reported[0].tracepoint, "attention_of");
}

#[test]
fn attention_of_five_dimensions_is_a_shape_error() {
    let (session, events) = start(full());
    attention_of(&[1, 1, 1, 1, 2], &[0.5, 0.5]);
    let (tracer, errors) = session.finish_with_errors();
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Shape);
    assert!(
        error.message.contains("[1, 1, 1, 1, 2]"),
        "{}",
        error.message
    );
    assert!(tracer.attention_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Attention(_))), 0);
}

#[test]
fn attention_whose_shape_does_not_match_its_data_is_a_shape_error() {
    let (session, events) = start(full());
    // Two query rows of three keys claimed, five values held; then one row of two claimed,
    // four held.
    attention_of(&[2, 3], &[0.2, 0.3, 0.5, 0.1, 0.9]);
    attention_of(&[1, 2], &[0.5, 0.5, 0.5, 0.5]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    for (error, shape) in errors.iter().zip(["[2, 3]", "[1, 2]"]) {
        assert_eq!(error.kind, RecordErrorKind::Shape);
        assert_eq!(tracepoint_name(error), "attention_of");
        assert!(error.message.contains(shape), "{}", error.message);
        assert!(
            error.message.contains("does not match"),
            "{}",
            error.message
        );
    }
    assert!(
        tracer.attention_traces().is_empty(),
        "no row is read from data that does not fit its shape: {:?}",
        tracer.attention_traces()
    );
    assert_eq!(events.count(|e| matches!(e, Event::Attention(_))), 0);
}

#[test]
fn attention_without_keys_is_a_shape_error_as_logits_without_a_vocabulary_are() {
    let (session, events) = start(full());
    attention_of(&[2, 0], &[]);
    logits_of(&[2, 0], &[]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    for (error, name) in errors.iter().zip(["attention_of", "logits_of"]) {
        assert_eq!(error.kind, RecordErrorKind::Shape);
        assert_eq!(tracepoint_name(error), name);
        assert!(error.message.contains("[2, 0]"), "{}", error.message);
    }
    assert!(tracer.attention_traces().is_empty());
    assert!(tracer.logit_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Attention(_))), 0);
    assert_eq!(events.count(|e| matches!(e, Event::Logits(_))), 0);
}

// ---------------------------------------------------------------------------------------------
// Logits
// ---------------------------------------------------------------------------------------------

#[trace_logits]
fn logits_of(shape: &[usize], data: &[f32]) -> Claimed {
    Claimed::new(shape, data)
}

#[trace_model]
fn decode_to(shape: &[usize], data: &[f32]) -> Claimed {
    logits_of(shape, data)
}

#[test]
fn scalar_logits_are_a_shape_error() {
    let (session, events) = start(full());
    let logits = decode_to(&[], &[3.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(logits.data, [3.0]);
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Shape);
    assert_eq!(tracepoint_name(error), "logits_of");
    assert!(error.message.contains("[]"), "{}", error.message);
    assert!(tracer.logit_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Logits(_))), 0);
    let reported = events.errors();
    assert_eq!(reported.len(), 1);
    assert_eq!(
        (reported[0].pass, reported[0].layer),
        (Some(0), None),
        "the error says where it happened"
    );
}

#[test]
fn logits_of_four_dimensions_or_no_vocabulary_are_shape_errors() {
    let (session, events) = start(full());
    decode_to(&[1, 1, 1, 2], &[0.0, 1.0]);
    decode_to(&[2, 0], &[]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors.iter().all(|e| e.kind == RecordErrorKind::Shape));
    assert!(
        errors[0].message.contains("[1, 1, 1, 2]"),
        "{}",
        errors[0].message
    );
    assert!(
        errors[1].message.contains("[2, 0]"),
        "{}",
        errors[1].message
    );
    assert!(tracer.logit_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Logits(_))), 0);
}

#[test]
fn logits_whose_shape_does_not_match_their_data_are_a_shape_error() {
    let (session, events) = start(full());
    decode_to(&[2, 4], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let (tracer, errors) = session.finish_with_errors();
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Shape);
    assert!(
        error.message.contains("does not match"),
        "{}",
        error.message
    );
    assert!(tracer.logit_traces().is_empty());
    assert_eq!(events.count(|e| matches!(e, Event::Logits(_))), 0);
}

/// Logits shorter than the token ids tracked: a row of 8 logits, tokens 2 and 40 tracked.
fn short_logits_session() -> (ModelTracer, Vec<RecordError>, Events) {
    let mut config = full();
    config.tracked_tokens = Some(vec![2, 40]);
    let (session, events) = start(config);
    decode_to(&[8], &[0.5, 0.1, 0.9, -1.0, 0.3, 0.2, 0.0, 0.4]);
    let (tracer, errors) = session.finish_with_errors();
    (tracer, errors, events)
}

#[test]
fn a_tracked_token_beyond_the_logits_gets_nan_and_the_last_rank() {
    // As `LogitEvolutionTrace::record_logits` and `TrackedLogit::logit` document: a token id
    // outside the row has logit NaN and rank `logits.len()`; the token inside is unaffected.
    let (tracer, _, events) = short_logits_session();
    let trace = &tracer.logit_traces()[0];
    let inside = &trace.tracked_tokens[0];
    assert_eq!(
        (
            inside.token_id,
            inside.logits_by_layer[0],
            inside.ranks_by_layer[0]
        ),
        (2, 0.9, 0)
    );
    let outside = &trace.tracked_tokens[1];
    assert_eq!(outside.token_id, 40);
    assert!(outside.logits_by_layer[0].is_nan());
    assert_eq!(outside.ranks_by_layer, [8]);
    let rows: Vec<_> = events
        .0
        .borrow()
        .iter()
        .filter_map(|e| match e {
            Event::Logits(logits) => Some(logits.batch_rows.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1);
    let tracked = &rows[0][0].tracked;
    assert_eq!((tracked[1].token, tracked[1].rank), (40, 8));
    assert!(tracked[1].logit.is_nan());
}

#[test]
fn a_tracked_token_beyond_the_logits_is_reported() {
    let (_, errors, events) = short_logits_session();
    let about_40 = |message: &str| message.contains("40");
    assert!(
        errors
            .iter()
            .any(|e| tracepoint_name(e) == "logits_of" && about_40(&e.message)),
        "expected a record error of `logits_of` naming token 40 (the row has 8 logits), \
         got {errors:#?}"
    );
    assert!(events.errors().iter().any(|e| about_40(&e.message)));
}

// ---------------------------------------------------------------------------------------------
// Stages outside a layer
// ---------------------------------------------------------------------------------------------

#[trace_model]
fn model_without_layers(x: &[f32]) -> Vec<f32> {
    let hidden: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    trace_tensor!("attn_out", &hidden);
    hidden
}

#[trace_layer]
fn plain_block(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v + 1.0).collect()
}

#[trace_model]
fn one_block(x: &[f32]) -> Vec<f32> {
    plain_block(x)
}

#[test]
fn a_stage_outside_any_layer_is_an_outside_layer_error() {
    let (session, events) = start(ModelTracerConfig::lightweight());
    for _ in 0..3 {
        model_without_layers(&[1.0, 2.0]);
    }
    one_block(&[1.0]);
    let (tracer, errors) = session.finish_with_errors();
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::OutsideLayer);
    assert_eq!(tracepoint_name(error), "attn_out");
    assert!(error.message.contains("attn_out"), "{}", error.message);
    assert_eq!(error.occurrences, 3);
    let reported = events.errors();
    assert_eq!(reported.len(), 1, "one error event: its first occurrence");
    assert_eq!(reported[0].kind, RecordErrorKind::OutsideLayer);
    assert_eq!((reported[0].pass, reported[0].layer), (Some(0), None));
    // The stage joins no layer, not even the next one.
    let layers = events.layers();
    assert_eq!(layers.len(), 1);
    assert!(layers[0].stage("attn_out").is_none(), "{:?}", layers[0]);
    let recorded_layers: usize = tracer
        .activation_traces()
        .iter()
        .map(|pass| pass.layers.len())
        .sum();
    assert_eq!(recorded_layers, 1);
}

#[test]
fn an_inline_macros_error_names_its_function() {
    let (session, events) = start(ModelTracerConfig::lightweight());
    model_without_layers(&[1.0, 2.0]);
    let (_, errors) = session.finish_with_errors();
    let listed: Vec<&str> = model_trace::tracepoints()
        .into_iter()
        .filter(|tp| tp.name == "attn_out")
        .map(|tp| tp.function)
        .collect();
    assert_eq!(listed, ["model_without_layers"], "what the listing says");
    let error = only_error(&errors);
    assert_eq!(
        error.tracepoint.map(|tp| tp.function),
        Some("model_without_layers"),
        "Session::errors"
    );
    let path = "error_paths::model_without_layers";
    assert_eq!(events.errors()[0].function, path, "the error event");
    assert_eq!(events.session_end().errors[0].function, path, "session_end");
}

// ---------------------------------------------------------------------------------------------
// Layer input and output that cannot be read
// ---------------------------------------------------------------------------------------------

#[trace_layer]
fn unreadable_block(x: &Unreadable) -> Unreadable {
    Unreadable {
        shape: x.shape.clone(),
    }
}

#[trace_layer]
fn block_with_unreadable_output(x: &[f32]) -> Unreadable {
    Unreadable {
        shape: vec![x.len()],
    }
}

#[trace_layer]
fn fallible_block(x: &[f32]) -> Result<Vec<f32>, String> {
    Err(format!("{} values is not enough", x.len()))
}

/// Runs `block` as a forward pass of its own (layers outside any pass are another matter).
#[trace_model]
fn pass_of<T>(block: impl FnOnce() -> T) -> T {
    block()
}

#[test]
fn layer_input_and_output_that_fail_to_read_are_read_errors() {
    let (session, events) = start(ModelTracerConfig::lightweight());
    let out = pass_of(|| unreadable_block(&Unreadable { shape: vec![2, 3] }));
    let (_, errors) = session.finish_with_errors();
    assert_eq!(out.shape, [2, 3]);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    for (error, what) in errors.iter().zip(["input", "output"]) {
        assert_eq!(error.kind, RecordErrorKind::Read);
        assert_eq!(tracepoint_name(error), "unreadable_block");
        assert!(
            error.message.starts_with(what) && error.message.contains("device lost"),
            "{what}: {}",
            error.message
        );
    }
    let reported = events.errors();
    assert_eq!(reported.len(), 2);
    assert!(reported
        .iter()
        .all(|e| e.kind == RecordErrorKind::Read && e.layer == Some(0)));
    // The layer is still there, with neither tensor.
    let layers = events.layers();
    assert_eq!(layers.len(), 1);
    assert!(layers[0].stages.is_empty(), "{:?}", layers[0].stages);
}

#[test]
fn an_unreadable_output_keeps_the_input() {
    let (session, events) = start(ModelTracerConfig::lightweight());
    pass_of(|| block_with_unreadable_output(&[1.0, 2.0, 3.0]));
    let (_, errors) = session.finish_with_errors();
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Read);
    assert!(error.message.starts_with("output"), "{}", error.message);
    let layers = events.layers();
    let names: Vec<&str> = layers[0].stages.iter().map(|s| &*s.name).collect();
    assert_eq!(names, ["input"]);
    assert_eq!(layers[0].stages[0].tensor.stats.count, 3);
}

#[test]
fn an_err_output_records_no_output_and_is_no_error() {
    // Documented on the facade: "an `Err` or `None` records no output".
    let (session, events) = start(ModelTracerConfig::lightweight());
    assert!(pass_of(|| fallible_block(&[1.0])).is_err());
    let (_, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let layers = events.layers();
    let names: Vec<&str> = layers[0].stages.iter().map(|s| &*s.name).collect();
    assert_eq!(names, ["input"]);
}

// ---------------------------------------------------------------------------------------------
// Quantized output and reference of different lengths
// ---------------------------------------------------------------------------------------------

fn reference_one_longer(x: &[f32]) -> Vec<f32> {
    x.iter().copied().chain([0.0]).collect()
}

#[trace_quant(reference = reference_one_longer, quant = Q8_0)]
fn quantized_identity(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[test]
fn a_quantized_output_and_reference_of_different_lengths_are_a_mismatch() {
    let (session, events) = start(full());
    let out = quantized_identity(&[1.0, 2.0, 3.0]);
    quantized_identity(&[1.0, 2.0, 3.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(out, [1.0, 2.0, 3.0]);
    let error = only_error(&errors);
    assert_eq!(error.kind, RecordErrorKind::Mismatch);
    assert_eq!(tracepoint_name(error), "quantized_identity");
    assert!(
        error
            .message
            .contains("has 3 values but the reference has 4"),
        "{}",
        error.message
    );
    assert_eq!(error.occurrences, 2);
    let kept: usize = tracer.quant_traces().iter().map(|q| q.traces.len()).sum();
    assert_eq!(kept, 0, "no error figure for outputs that do not compare");
    assert_eq!(events.count(|e| matches!(e, Event::Quant(_))), 0);
    assert_eq!(events.errors().len(), 1);
    assert_eq!(events.errors()[0].kind, RecordErrorKind::Mismatch);
}

// ---------------------------------------------------------------------------------------------
// Counting errors
// ---------------------------------------------------------------------------------------------

/// Two stages of one name outside any layer: same kind, same message, two tracepoints.
fn stray_stages(x: &[f32]) {
    trace_tensor!("stray", x);
    trace_tensor!("stray", x);
}

#[test]
fn an_error_repeated_is_one_entry_with_its_count() {
    let (session, events) = start(ModelTracerConfig::lightweight());
    for _ in 0..100 {
        stray_stages(&[1.0]);
    }
    assert_eq!(
        session.errors().len(),
        2,
        "errors are readable before the end"
    );
    let (tracer, errors) = session.finish_with_errors();
    // One entry per tracepoint, though both say the same thing.
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(!std::ptr::eq(
        errors[0].tracepoint.unwrap(),
        errors[1].tracepoint.unwrap()
    ));
    for error in &errors {
        assert_eq!(error.kind, RecordErrorKind::OutsideLayer);
        assert_eq!(error.occurrences, 100);
        assert!(error.to_string().ends_with("(x100)"), "{error}");
    }
    assert_eq!(
        events.errors().len(),
        2,
        "an error event per distinct error"
    );
    let end = events.session_end();
    assert_eq!(end.errors.len(), 2);
    assert!(end.errors.iter().all(|e| e.occurrences == 100));
    assert_eq!(end.errors_not_kept, 0);
    assert_eq!(tracer.summary().record_errors, 2);
}

#[test]
fn distinct_errors_are_capped_and_the_rest_counted() {
    let (session, events) = start(full());
    let extra = 10;
    // Every shape is another message: MAX_DISTINCT_ERRORS + 10 distinct errors.
    let shape = |n: usize| [1, 1, 1, 1, n];
    for n in 1..=MAX_DISTINCT_ERRORS + extra {
        attention_of(&shape(n), &vec![0.0; n]);
    }
    // A kept error is still counted; an error past the cap is counted per occurrence.
    for _ in 0..4 {
        attention_of(&shape(1), &[0.0]);
    }
    let last = MAX_DISTINCT_ERRORS + extra;
    for _ in 0..3 {
        attention_of(&shape(last), &vec![0.0; last]);
    }
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(errors.len(), MAX_DISTINCT_ERRORS);
    assert!(errors[0].message.contains("[1, 1, 1, 1, 1]"));
    assert_eq!(errors[0].occurrences, 5);
    assert!(errors.iter().skip(1).all(|e| e.occurrences == 1));
    let last_kept = format!("{:?}", shape(MAX_DISTINCT_ERRORS));
    assert!(errors[MAX_DISTINCT_ERRORS - 1].message.contains(&last_kept));

    assert_eq!(events.errors().len(), MAX_DISTINCT_ERRORS);
    let end = events.session_end();
    assert_eq!(end.errors.len(), MAX_DISTINCT_ERRORS);
    assert_eq!(end.errors_not_kept, extra + 3);
    let summary = tracer.summary();
    assert_eq!(summary.record_errors, MAX_DISTINCT_ERRORS);
    assert_eq!(summary.record_errors_not_kept, extra + 3);
    assert!(
        summary
            .to_string()
            .contains("13 more occurrences of further errors"),
        "{summary}"
    );
}
