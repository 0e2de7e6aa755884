//! The record hooks: what the other annotations call with the value they trace.

use super::read::{read_stage, read_tensor};
use crate::record::RecordErrorKind;
use crate::record::{
    attention_rows, labels, logit_row, AttentionDims, AttentionEvent, Event, KvCacheEvent,
    KvCacheStateTrace, LogitsDims, LogitsEvent, QuantEvent, QuantType, QuantizationErrorTrace,
    Stage,
};
use crate::session::state::TensorPlan;
use crate::session::{interventions, registry};
use crate::summary::TensorSummary;
use crate::tensor::TraceTensor;
use crate::tracepoint::callsite::{Callsite, Interest};

/// `trace_tensor!("stage", &t)`: `tensor` as a stage of the enclosing layer. A stage that the
/// filter does not admit itself is recorded only inside a layer that records, and is no error
/// outside one (the filter did not ask for it).
pub fn record_stage(cs: &'static Callsite, stage: &'static str, tensor: Option<&dyn TraceTensor>) {
    let interest = cs.interest();
    let admitted = interest.records();
    if !admitted && interest != Interest::InRecordedLayer {
        return;
    }
    let generation = registry::active_generation();
    let planned = registry::with_session(generation, |s| {
        let layer = if admitted {
            s.enclosing_layer()
        } else {
            s.enclosing_recorded_layer()
        };
        layer.map(|layer| (layer, s.plan(cs.tracepoint(), Some(layer))))
    });
    let Some((layer, plan)) = planned.flatten() else {
        if admitted {
            cs.note_error(
                RecordErrorKind::OutsideLayer,
                format!("stage `{stage}` outside any #[trace_layer]: not recorded"),
            );
        }
        return;
    };
    let Some(tensor) = tensor_or_error(cs, &format!("stage `{stage}`"), tensor) else {
        return;
    };
    if Stage::from_name(stage).is_some_and(Stage::is_layer_boundary) {
        cs.note_error(
            RecordErrorKind::Config,
            format!("stage `{stage}` is the layer's own; `#[trace_layer]` records it"),
        );
        return;
    }
    if let Some(read) = read_stage(generation, cs, stage, layer, plan, tensor) {
        registry::with_session(generation, |s| s.record_stage(stage, read));
    }
}

/// `trace_stage!("stage", value)`, before the value is recorded: applies the session's
/// interventions on `stage` in the enclosing layer to it (`None`: the value cannot be changed,
/// an error when an intervention selects it). Costs one session lookup when there are none.
pub fn replace_stage(
    cs: &'static Callsite,
    stage: &'static str,
    tensor: Option<&mut dyn TraceTensor>,
) {
    let generation = registry::active_generation();
    let layer = registry::with_session(generation, |s| {
        s.has_interventions().then(|| s.enclosing_layer())
    });
    if let Some(layer) = layer.flatten() {
        interventions::intervene(generation, cs, layer, stage, tensor);
    }
}

/// What `trace_stage!` returns: its value, which the caller must go on with (an intervention
/// may have changed it).
#[must_use = "`trace_stage!` returns the value to go on with, which an intervention may have \
              changed: `let h = trace_stage!(\"name\", h);`"]
#[inline(always)]
pub fn keep<T>(value: T) -> T {
    value
}

/// What a "not a tensor" error adds: what is one.
pub(super) const NOT_A_TENSOR: &str =
    " (tensors are what implement `TraceTensor`: candle's `Tensor`, \
     ndarray's arrays, `[f32]`, `[f32; N]`, `Vec<f32>`, `TensorRef`, and references, boxes, \
     `Ok` and `Some` of these; wrap other buffers in a `TensorRef`)";

/// `value` when it is a tensor; otherwise `None`, and the error noted for `what`.
pub(super) fn tensor_or_error<'a>(
    cs: &'static Callsite,
    what: &str,
    value: Option<&'a dyn TraceTensor>,
) -> Option<&'a dyn TraceTensor> {
    if value.is_none() {
        cs.note_error(
            RecordErrorKind::NotATensor,
            format!("{what}: the value is not a tensor{NOT_A_TENSOR}"),
        );
    }
    value
}

/// The skeleton of the hooks that keep rows of a tensor (attention, logits): reads `tensor`
/// as `plan` says and hands its values to `rows` when it holds the `expected` number of them
/// (`None`: more than fit in memory). `None`, and a shape error noted, when it does not.
#[allow(clippy::too_many_arguments)]
fn read_rows(
    generation: u32,
    cs: &'static Callsite,
    what: &str,
    layer: usize,
    plan: TensorPlan,
    tensor: &dyn TraceTensor,
    expected: Option<usize>,
    rows: &mut dyn FnMut(&[f32]),
) -> Option<TensorSummary> {
    let mut fits = true;
    let mut read_rows = |data: &[f32]| {
        fits = expected == Some(data.len());
        if fits {
            rows(data);
        }
    };
    let summary = read_tensor(
        generation,
        cs,
        what,
        Some(layer),
        plan,
        tensor,
        Some(&mut read_rows),
    )?;
    if !fits {
        let shape = tensor.shape();
        cs.note_error(
            RecordErrorKind::Shape,
            format!("{what}: shape {shape:?} does not match the data"),
        );
        return None;
    }
    Some(summary)
}

/// Attention probabilities `[batch, heads, q_len, k_len]` (missing leading dimensions are 1):
/// every row of every batch row. `layer` `None`: the enclosing layer, else one past the last
/// layer of the pass.
pub fn record_attention(
    cs: &'static Callsite,
    layer: Option<usize>,
    probs: Option<&dyn TraceTensor>,
) {
    if !cs.records() {
        return;
    }
    let Some(probs) = tensor_or_error(cs, "attention", probs) else {
        return;
    };
    let generation = registry::active_generation();
    let Some((layer, config, plan)) = registry::with_session(generation, |s| {
        let layer = layer.unwrap_or_else(|| s.layer_or_final());
        (
            layer,
            s.config.attention_config.clone(),
            s.plan(cs.tracepoint(), Some(layer)).without_rows(),
        )
    }) else {
        return;
    };
    if !config.should_trace_layer(layer) {
        return;
    }
    let shape = probs.shape();
    let Some(dims) = AttentionDims::of(&shape) else {
        cs.note_error(
            RecordErrorKind::Shape,
            format!("attention: shape {shape:?} is not [batch, heads, q_len, k_len] (or a suffix of it)"),
        );
        return;
    };
    if dims.k_len == 0 {
        cs.note_error(
            RecordErrorKind::Shape,
            format!("attention: shape {shape:?} has no keys (k_len 0)"),
        );
        return;
    }
    let mut rows = Vec::new();
    let mut keep_rows = |data: &[f32]| rows = attention_rows(&config, layer, dims, data);
    let Some(summary) = read_rows(
        generation,
        cs,
        "attention",
        layer,
        plan,
        probs,
        dims.len(),
        &mut keep_rows,
    ) else {
        return;
    };
    let (tracepoint, function) = labels(Some(cs.tracepoint()));
    registry::with_session(generation, |s| {
        s.emit_record(|seq, pass| {
            Event::Attention(AttentionEvent {
                seq,
                pass,
                layer,
                tracepoint,
                function,
                probs: summary,
                rows,
            })
        });
    });
}

/// Logits `[vocab]`, `[batch, vocab]` or `[batch, seq, vocab]`: the next-token row of each batch
/// row (the last position). `layer` `None`: the enclosing layer, else the final one (one past the
/// last layer recorded in this pass).
pub fn record_logits(
    cs: &'static Callsite,
    layer: Option<usize>,
    logits: Option<&dyn TraceTensor>,
) {
    if !cs.records() {
        return;
    }
    let Some(logits) = tensor_or_error(cs, "logits", logits) else {
        return;
    };
    let shape = logits.shape();
    let Some(dims) = LogitsDims::of(&shape) else {
        cs.note_error(
            RecordErrorKind::Shape,
            format!(
                "logits: shape {shape:?} is not [vocab], [batch, vocab] or [batch, seq, vocab]"
            ),
        );
        return;
    };
    let vocab = dims.vocab;
    if vocab == 0 {
        cs.note_error(
            RecordErrorKind::Shape,
            format!("logits: shape {shape:?} has an empty vocabulary"),
        );
        return;
    }
    let generation = registry::active_generation();
    let Some((pass, layer, plan, top_k, tracked)) = registry::with_session(generation, |s| {
        let pass = s.open_pass(cs.tracepoint());
        let layer = layer.unwrap_or_else(|| s.layer_or_final());
        let plan = s.plan(cs.tracepoint(), Some(layer)).without_rows();
        (
            pass,
            layer,
            plan,
            s.config.auto_track_top_k,
            s.config.tracked_tokens.clone().unwrap_or_default(),
        )
    }) else {
        return;
    };
    let mut rows = Vec::with_capacity(dims.batch);
    let (mut positions, mut values) = (Vec::new(), Vec::new());
    let mut keep_rows = |data: &[f32]| {
        for (batch, row) in dims.next_token_rows(data).enumerate() {
            let scratch = (&mut positions, &mut values);
            rows.push(logit_row(batch, row, top_k, &tracked, scratch));
            registry::with_session(generation, |s| s.add_logit_row(layer, batch, row));
        }
    };
    let Some(summary) = read_rows(
        generation,
        cs,
        "logits",
        layer,
        plan,
        logits,
        dims.len(),
        &mut keep_rows,
    ) else {
        return;
    };
    // A tracked token past the row is kept (logit NaN, rank past the last), and said: it is
    // most likely a vocabulary that does not match the tokenizer's.
    if let Some(&token) = tracked.iter().find(|&&token| token as usize >= vocab) {
        cs.note_error(
            RecordErrorKind::Shape,
            format!(
                "logits: tracked token {token} is beyond the row's {vocab} logits \
                 (a vocabulary that does not match the tokenizer?)"
            ),
        );
    }
    let (tracepoint, function) = labels(Some(cs.tracepoint()));
    registry::with_session(generation, |s| {
        s.add_logits_stats(layer, &summary.stats);
        s.emit_record(|seq, _| {
            Event::Logits(LogitsEvent {
                seq,
                pass,
                layer,
                tracepoint,
                function,
                logits: summary,
                batch_rows: rows,
            })
        });
    });
}

/// The arguments of `#[trace_kv_cache(...)]`, evaluated after the body.
#[derive(Debug, Clone, Copy, Default)]
pub struct KvCacheStep {
    pub layer: Option<usize>,
    pub len: Option<usize>,
    pub capacity: Option<usize>,
    pub bytes: Option<usize>,
    pub evictions: Option<usize>,
    pub hit_rate: Option<f32>,
}

/// One KV-cache step of the cache of `layer` (default: the enclosing layer; outside any, the
/// model's one cache). Each cache's steps are numbered 0, 1, 2, ...
pub fn record_kv_cache(cs: &'static Callsite, step: KvCacheStep) {
    if !cs.records() {
        return;
    }
    registry::with_active(|session| {
        let layer = step.layer.or_else(|| session.enclosing_layer());
        let len = step.len.unwrap_or(0);
        let state = KvCacheStateTrace {
            step: session.next_kv_step(layer),
            layer,
            valid_positions: len,
            capacity: step.capacity.unwrap_or(len),
            cache_size_bytes: step.bytes.unwrap_or(0),
            evictions_this_step: step.evictions.unwrap_or(0),
            cache_hit_rate: step.hit_rate,
        };
        let (tracepoint, function) = labels(Some(cs.tracepoint()));
        session.emit_record(|seq, pass| {
            Event::KvCache(KvCacheEvent {
                seq,
                pass,
                tracepoint,
                function,
                state,
            })
        });
    });
}

/// Quantization error of `quantized` against `reference`; the site is the tracepoint name,
/// the layer the enclosing one (else the final one). `quant` `None`: guessed from the dtype.
pub fn record_quant(
    cs: &'static Callsite,
    quant: Option<QuantType>,
    quantized: Option<&dyn TraceTensor>,
    reference: Option<&dyn TraceTensor>,
) {
    if !cs.records() {
        return;
    }
    let (Some(quantized), Some(reference)) = (quantized, reference) else {
        cs.note_error(
            RecordErrorKind::NotATensor,
            format!("quant: the output or the reference output is not a tensor{NOT_A_TENSOR}"),
        );
        return;
    };
    let quant = quant.unwrap_or_else(|| quant_from_dtype(quantized.dtype_name()));
    let generation = registry::active_generation();
    let Some(layer) = registry::with_session(generation, |s| s.layer_or_final()) else {
        return;
    };
    let site = cs.tracepoint().name;
    let mut trace = None;
    let read = quantized.with_f32(&mut |q| {
        let inner = reference.with_f32(&mut |r| {
            trace = Some(QuantizationErrorTrace::compute(site, layer, q, r, quant));
        });
        if let Err(error) = inner {
            cs.note_error(RecordErrorKind::Read, format!("quant reference: {error}"));
        }
    });
    match (read, trace) {
        (Err(error), _) => cs.note_error(RecordErrorKind::Read, format!("quant: {error}")),
        (Ok(()), Some(Err(mismatch))) => {
            cs.note_error(RecordErrorKind::Mismatch, mismatch.to_string())
        }
        (Ok(()), Some(Ok(error))) => {
            let (tracepoint, function) = labels(Some(cs.tracepoint()));
            registry::with_session(generation, |s| {
                s.emit_record(|seq, pass| {
                    Event::Quant(QuantEvent {
                        seq,
                        pass,
                        tracepoint,
                        function,
                        error,
                    })
                });
            });
        }
        (Ok(()), None) => {}
    }
}

fn quant_from_dtype(dtype: &str) -> QuantType {
    match dtype {
        "f16" => QuantType::F16,
        "bf16" => QuantType::BF16,
        _ => QuantType::F32,
    }
}
