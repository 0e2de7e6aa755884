//! Attention and logits of a batch larger than one. `docs/trace-format.md` decides: attention
//! is read as `[batch, heads, q_len, k_len]` and its `rows` carry `batch`; logits are read as
//! `[batch, vocab]` or `[batch, seq, vocab]` and `batch_rows` holds each batch row's next-token
//! row (its last position); `logit_evolution` has one entry per batch row. So every batch row is
//! recorded, with its own index and from its own values.
//!
//! The data makes each batch row (and each position) prefer another key or token, so reading
//! row 0 only, or labelling every row 0, or reading the first position for the next token,
//! changes what is recorded.
//!
//! Sessions are built with `Session::builder`, which reads no environment variable.
#![cfg(feature = "enabled")]

mod common;

use model_trace::{
    trace_attention, trace_logits, trace_model, Event, ModelTracer, ModelTracerConfig, Session,
    TensorRef,
};

use common::Events;

fn run(config: ModelTracerConfig, forward: impl FnOnce()) -> (ModelTracer, Events) {
    let events = Events::default();
    let session = Session::builder(config)
        .sink(events.clone())
        .start()
        .expect("an in-memory session cannot fail to start");
    forward();
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:#?}");
    (tracer, events)
}

#[trace_attention(layer = 0)]
fn attention<'a>(probs: &'a [f32], shape: &'a [usize]) -> TensorRef<'a> {
    TensorRef::new(probs, shape).expect("shape fits")
}

#[trace_logits]
fn logits<'a>(values: &'a [f32], shape: &'a [usize]) -> TensorRef<'a> {
    TensorRef::new(values, shape).expect("shape fits")
}

#[trace_model]
fn forward<T>(step: impl FnOnce() -> T) -> T {
    step()
}

/// A one-hot-ish row of `k_len` weights peaking at `peak`.
fn row(k_len: usize, peak: usize) -> Vec<f32> {
    let rest = 0.1 / (k_len - 1) as f32;
    (0..k_len)
        .map(|k| if k == peak { 0.9 } else { rest })
        .collect()
}

#[test]
fn attention_records_every_batch_row_with_its_index() {
    // [batch 2, heads 2, q_len 2, k_len 4]; the row (b, h, q) peaks at key (2b + h + q) % 4.
    let (batch, heads, q_len, k_len) = (2, 2, 2, 4);
    let peak = |b: usize, h: usize, q: usize| (2 * b + h + q) % k_len;
    let mut probs = Vec::new();
    for b in 0..batch {
        for h in 0..heads {
            for q in 0..q_len {
                probs.extend(row(k_len, peak(b, h, q)));
            }
        }
    }
    let shape = [batch, heads, q_len, k_len];
    let (tracer, events) = run(ModelTracerConfig::full(), || {
        forward(|| attention(&probs, &shape));
    });

    let rows = tracer.attention_traces();
    assert_eq!(rows.len(), batch * heads * q_len, "{rows:#?}");
    let mut seen = Vec::new();
    for trace in rows {
        // query_pos = k_len - q_len + q.
        let q = trace.query_pos + q_len - k_len;
        let key = (trace.batch, trace.head_idx, q);
        assert_eq!(
            trace.top_k_positions[0],
            peak(trace.batch, trace.head_idx, q),
            "batch {} head {} query {q}: the row read is not this batch row's",
            trace.batch,
            trace.head_idx
        );
        assert_eq!(trace.layer_idx, 0);
        seen.push(key);
    }
    seen.sort_unstable();
    let expected: Vec<_> = (0..batch)
        .flat_map(|b| (0..heads).flat_map(move |h| (0..q_len).map(move |q| (b, h, q))))
        .collect();
    assert_eq!(seen, expected, "every (batch, head, query) once");

    // The trace file's event carries the same rows, and the summary of the whole tensor.
    let recorded = events.0.borrow();
    let event = recorded
        .iter()
        .find_map(|e| match e {
            Event::Attention(a) => Some(a),
            _ => None,
        })
        .expect("an attention event");
    assert_eq!(event.rows, rows);
    assert_eq!(event.probs.shape, shape);
    assert_eq!(event.probs.stats.count, probs.len());
}

#[test]
fn attention_batch_rows_respect_the_head_filter() {
    let (batch, heads, q_len, k_len) = (3, 2, 1, 3);
    let mut probs = Vec::new();
    for b in 0..batch {
        for h in 0..heads {
            probs.extend(row(k_len, (b + h) % k_len));
        }
    }
    let mut config = ModelTracerConfig::full();
    config.attention_config.heads = Some(vec![1]);
    let shape = [batch, heads, q_len, k_len];
    let (tracer, _) = run(config, || {
        forward(|| attention(&probs, &shape));
    });
    let kept: Vec<(usize, usize, usize)> = tracer
        .attention_traces()
        .iter()
        .map(|t| (t.batch, t.head_idx, t.top_k_positions[0]))
        .collect();
    assert_eq!(kept, [(0, 1, 1), (1, 1, 2), (2, 1, 0)]);
}

/// `[batch 2, vocab 5]`: batch row 0 prefers token 1, batch row 1 token 3.
const BATCH_VOCAB: [f32; 10] = [
    0.0, 4.0, 1.0, 2.0, -1.0, //
    0.5, -2.0, 1.0, 6.0, 3.0,
];

#[test]
fn logits_record_every_batch_row_with_its_index() {
    let mut config = ModelTracerConfig::full();
    config.auto_track_top_k = 2;
    let (tracer, events) = run(config, || {
        forward(|| logits(&BATCH_VOCAB, &[2, 5]));
    });

    let rows = events.logit_rows();
    assert_eq!(rows.len(), 1);
    let batches: Vec<(usize, Vec<u32>)> = rows[0]
        .iter()
        .map(|r| (r.batch, r.top_tokens.clone()))
        .collect();
    assert_eq!(batches, [(0, vec![1, 3]), (1, vec![3, 4])]);
    assert_eq!(rows[0][1].top_logits, [6.0, 3.0]);

    // One logit evolution per batch row, each following its own best tokens.
    let traces = tracer.logit_traces();
    let evolutions: Vec<(usize, Vec<u32>)> = traces
        .iter()
        .map(|t| {
            let tokens = t.tracked_tokens.iter().map(|k| k.token_id).collect();
            (t.batch, tokens)
        })
        .collect();
    assert_eq!(evolutions, [(0, vec![1, 3]), (1, vec![3, 4])]);
    for trace in traces {
        assert_eq!(trace.tracked_tokens[0].ranks_by_layer, [0]);
    }
}

#[test]
fn tracked_tokens_are_ranked_in_each_batch_row() {
    let mut config = ModelTracerConfig::full();
    config.tracked_tokens = Some(vec![3]);
    let (tracer, events) = run(config, || {
        forward(|| logits(&BATCH_VOCAB, &[2, 5]));
    });
    // Token 3: logit 2.0 (rank 1) in batch row 0, 6.0 (rank 0) in batch row 1.
    let tracked: Vec<(usize, f32, usize)> = events.logit_rows()[0]
        .iter()
        .map(|r| (r.batch, r.tracked[0].logit, r.tracked[0].rank))
        .collect();
    assert_eq!(tracked, [(0, 2.0, 1), (1, 6.0, 0)]);
    let evolutions: Vec<(usize, f32, usize)> = tracer
        .logit_traces()
        .iter()
        .map(|t| {
            let token = &t.tracked_tokens[0];
            (t.batch, token.logits_by_layer[0], token.ranks_by_layer[0])
        })
        .collect();
    assert_eq!(evolutions, [(0, 2.0, 1), (1, 6.0, 0)]);
}

#[test]
fn sequence_logits_use_each_batch_rows_last_position() {
    // [batch 2, seq 2, vocab 3]: position 0 prefers token 0 in both rows; the last position
    // prefers token 2 in batch row 0 and token 1 in batch row 1.
    let values = [
        9.0, 0.0, 1.0, /* b0 p1 */ 0.0, 1.0, 5.0, //
        9.0, 1.0, 0.0, /* b1 p1 */ 0.0, 7.0, 2.0,
    ];
    let mut config = ModelTracerConfig::full();
    config.auto_track_top_k = 1;
    let (tracer, events) = run(config, || {
        forward(|| logits(&values, &[2, 2, 3]));
    });
    let rows: Vec<(usize, Vec<u32>, Vec<f32>)> = events.logit_rows()[0]
        .iter()
        .map(|r| (r.batch, r.top_tokens.clone(), r.top_logits.clone()))
        .collect();
    assert_eq!(rows, [(0, vec![2], vec![5.0]), (1, vec![1], vec![7.0])]);
    let predicted: Vec<(usize, u32)> = tracer
        .logit_traces()
        .iter()
        .map(|t| (t.batch, t.tracked_tokens[0].token_id))
        .collect();
    assert_eq!(predicted, [(0, 2), (1, 1)]);
}
