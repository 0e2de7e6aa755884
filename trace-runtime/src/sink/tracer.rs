//! [`ModelTracer`]: the in-memory sink, which keeps the records of a run grouped by forward pass,
//! and the manual API for code that records by hand without a session.

mod manual;
mod summary;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

pub use summary::ModelTracerSummary;
use summary::Totals;

use crate::analysis::PassRecorder;
use crate::config::ModelTracerConfig;
use crate::record::{
    Anomaly, AttentionWeightTrace, Event, KvCacheSessionTrace, KvCacheStateTrace,
    LayerActivationTrace, LogitEvolutionTrace, ModelActivationTrace, ModelQuantizationError,
    QuantizationErrorTrace, RouterEvent,
};
use crate::sink::{SinkError, TraceSink};
use crate::stats::TensorStats;

/// The records of a run, in memory, grouped by forward pass.
///
/// Two ways to fill one:
///
/// * **A session** ([`Session`](crate::Session)) fills its tracer with what annotated code records,
///   and hands it back at [`finish`](crate::Session::finish). The session decides where passes and
///   layers begin and end; the tracer files what it is sent. A session that writes a trace file
///   keeps only the summary ([`is_summary_only`](Self::is_summary_only)) unless its builder
///   asked for [`in_memory(true)`](crate::SessionBuilder::in_memory): the file has the records.
/// * **By hand**: [`begin_forward`](Self::begin_forward) before a pass,
///   `record_*` in between, [`end_forward`](Self::end_forward) after it, which runs the anomaly
///   rules and the logit tracking. What a record needs:
///   * Activations and logits belong to a pass: recorded outside one, they are dropped.
///   * Attention rows, KV-cache steps, quantization errors and router calls stand on their own
///     and are kept outside a pass too (quantization errors made outside a pass are grouped under
///     `position: None`).
///   * Nothing panics, whatever the order of calls: `end_forward` without a pass returns `None`,
///     `begin_forward` during a pass first ends the open one.
///
/// **Bounded memory.** The tracer keeps records until they add up to
/// [`ModelTracerConfig::memory_limit_bytes`] (an estimate of their heap size, 16 MiB by
/// default); past it, new records are counted but not kept. [`summary`](Self::summary) covers
/// every record, kept or not, and says how many were not kept; a trace file keeps everything.
/// The limit is an estimate, not a measurement: SmolLM2's decode worker with the lightweight
/// tracer and the default 16 MiB peaks 20.4 MiB above the untraced build after 1,000 tokens,
/// allocator slack and the per-pass totals included (`bench_decode --memory`). Long runs
/// that must keep everything belong in a trace file.
///
/// Logit tracking: with `tracked_tokens` set, each logit row ranks those tokens at once. Without
/// it, each row is copied and, when the pass ends, the `auto_track_top_k` best tokens of the
/// final layer (the highest `layer_idx` recorded in the pass) are ranked in every recorded row,
/// so the trace shows how the eventual winners rose. The copies live only until the pass ends
/// and their buffers are reused by the next pass.
///
/// The tracer serializes with serde (a pass in progress is not included).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModelTracer {
    config: ModelTracerConfig,
    forward_passes: usize,
    activation_traces: Vec<ModelActivationTrace>,
    attention_traces: Vec<AttentionWeightTrace>,
    logit_traces: Vec<LogitEvolutionTrace>,
    quant_traces: Vec<ModelQuantizationError>,
    kv_trace: KvCacheSessionTrace,
    /// Router calls, in recording order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    router_traces: Vec<RouterEvent>,
    /// Running totals over every record, kept or not.
    totals: Totals,
    /// Estimated heap bytes of the kept records.
    retained_bytes: usize,
    /// Which entries belong to the pass in progress.
    #[serde(skip)]
    open: Option<OpenPass>,
    /// The pass recorded by hand, when the manual API opened it.
    #[serde(skip)]
    manual: Option<PassRecorder>,
    /// Handed back by a session of a build without the `enabled` feature.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    compiled_out: bool,
    /// Keeps only the summary: records are counted into it, not kept (the tracer of a session
    /// whose trace file holds them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    summary_only: bool,
}

/// The pass in progress and its entries, by index.
#[derive(Debug, Clone, Copy, Default)]
struct OpenPass {
    position: usize,
    activations: Option<usize>,
    quant: Option<usize>,
    layers: usize,
}

impl ModelTracer {
    /// A tracer recording what `config` asks for.
    pub fn new(config: ModelTracerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// What [`Session::finish`](crate::Session::finish) returns in a build without the
    /// `enabled` feature: empty, and its summary says that tracing is compiled out.
    #[cfg_attr(feature = "enabled", allow(dead_code))]
    pub(crate) fn compiled_out(config: ModelTracerConfig) -> Self {
        Self {
            compiled_out: true,
            ..Self::new(config)
        }
    }

    /// A tracer that keeps no records, only its summary (which covers every record): what a
    /// session that writes a trace file returns unless asked to keep the records too (see
    /// [`SessionBuilder::in_memory`](crate::SessionBuilder::in_memory)), and what replaying a
    /// long trace file into [`accept`](Self::accept) needs when only the summary is wanted: its
    /// memory does not grow with the passes.
    pub fn summary_only(config: ModelTracerConfig) -> Self {
        Self {
            summary_only: true,
            ..Self::new(config)
        }
    }

    /// Whether this tracer keeps only its summary: its record accessors are empty, the records
    /// are in the session's trace file.
    pub fn is_summary_only(&self) -> bool {
        self.summary_only
    }

    /// Whether this tracer comes from a session of a build without the `enabled` feature (see
    /// [`ENABLED`](crate::ENABLED)): nothing could be recorded.
    pub fn is_compiled_out(&self) -> bool {
        self.compiled_out
    }

    /// The configuration.
    pub fn config(&self) -> &ModelTracerConfig {
        &self.config
    }

    /// A tracer holding what `events` describe, as the session that wrote them would have
    /// handed it back: replaying a trace file's events into it gives the tracer of the run
    /// (within its memory limit).
    pub fn from_events<'a>(
        config: ModelTracerConfig,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Self {
        let mut tracer = Self::new(config);
        for event in events {
            tracer.accept(event);
        }
        tracer
    }

    // -----------------------------------------------------------------------------------------
    // Filing records, from the manual API or from events
    // -----------------------------------------------------------------------------------------

    /// Files one event of a session (see the module docs of [`Event`]).
    pub fn accept(&mut self, event: &Event) {
        match event {
            Event::PassBegin(begin) => {
                if self.open.is_some() {
                    // A pass without its end (a file cut short): file what it had.
                    self.close_pass(Vec::new(), Vec::new());
                }
                self.manual = None;
                self.open_pass(begin.position);
            }
            Event::PassEnd(end) => {
                if self.open.is_some() {
                    self.close_pass(end.anomalies.clone(), end.logit_evolution.clone());
                }
            }
            Event::Layer(layer) => match &mut self.open {
                _ if !self.config.trace_activations => {}
                // Only counted: building the record to drop it would cost an allocation.
                Some(open) if self.summary_only => open.layers += 1,
                Some(_) => self.keep_layer(LayerActivationTrace::from_event(layer)),
                None => {}
            },
            Event::Attention(attention) => {
                for row in &attention.rows {
                    if self.summary_only {
                        self.totals.count_attention(row);
                    } else {
                        self.record_attention(row.clone());
                    }
                }
                self.totals.attention.end_group();
            }
            Event::KvCache(kv) => self.record_kv_state(kv.state.clone()),
            Event::Quant(quant) => self.record_quant_error(quant.error.clone()),
            Event::Error(error) => self.totals.count_error(error),
            Event::SessionEnd(end) => self.totals.errors_not_kept = end.errors_not_kept,
            // What was recorded already says what the program saw; the trace file says why.
            Event::Router(router) => self.keep_router(router),
            Event::Logits(_) | Event::Intervention(_) => {}
        }
    }

    fn open_pass(&mut self, position: usize) {
        self.forward_passes += 1;
        let mut open = OpenPass {
            position,
            ..OpenPass::default()
        };
        if self.config.trace_activations
            && self.reserve(std::mem::size_of::<ModelActivationTrace>())
        {
            // Room for as many layers as the last pass had: the next pass of a model has as
            // many, and growing a vector of them pass after pass copies each layer record
            // several times. The memory limit counts each layer's room as the layer is kept
            // (`heap_size_of_layer`); a pass shorter than the last leaves its rest uncounted.
            let layers = self
                .activation_traces
                .last()
                .map_or(0, |last| last.layers.len());
            open.activations = Some(self.activation_traces.len());
            self.activation_traces.push(ModelActivationTrace {
                position,
                layers: Vec::with_capacity(layers),
                ..ModelActivationTrace::default()
            });
        }
        if self.config.trace_quant_error
            && self.reserve(std::mem::size_of::<ModelQuantizationError>())
        {
            open.quant = Some(self.quant_traces.len());
            self.quant_traces
                .push(ModelQuantizationError::for_position(position));
        }
        self.open = Some(open);
        self.totals.passes += 1;
    }

    fn close_pass(&mut self, anomalies: Vec<Anomaly>, logits: Vec<LogitEvolutionTrace>) {
        let Some(open) = self.open.take() else {
            return;
        };
        self.totals.attention.end_group();
        self.totals
            .close_pass(open.layers, open.position, &anomalies);
        if let Some(at) = open.activations {
            let trace = &mut self.activation_traces[at];
            trace.set_verdict(anomalies);
        }
        for trace in logits {
            self.totals.logit_traces += 1;
            if self.reserve(heap_size_of_logits(&trace)) {
                self.logit_traces.push(trace);
            }
        }
    }

    fn keep_layer(&mut self, trace: LayerActivationTrace) {
        let Some(open) = &mut self.open else {
            return;
        };
        open.layers += 1;
        let Some(at) = open.activations else {
            self.not_kept();
            return;
        };
        if self.reserve(heap_size_of_layer(&trace)) {
            self.activation_traces[at].add_layer(trace);
        }
    }

    fn keep_attention(&mut self, trace: AttentionWeightTrace) {
        self.totals.count_attention(&trace);
        if self.reserve(heap_size_of_attention(&trace)) {
            self.attention_traces.push(trace);
        }
    }

    fn keep_kv(&mut self, mut trace: KvCacheStateTrace) {
        trace.cache_hit_rate = trace.cache_hit_rate.filter(|r| r.is_finite());
        if self.reserve(std::mem::size_of::<KvCacheStateTrace>()) {
            self.kv_trace.add_step(trace);
        } else {
            self.kv_trace.account(&trace);
        }
    }

    fn keep_router(&mut self, router: &RouterEvent) {
        self.totals.router_calls += 1;
        if self.config.trace_router && self.reserve(heap_size_of_router(router)) {
            self.router_traces.push(router.clone());
        }
    }

    fn keep_quant(&mut self, trace: QuantizationErrorTrace) {
        self.totals.count_quant(&trace);
        if !self.reserve(heap_size_of_quant(&trace)) {
            return;
        }
        if let Some(at) = self.open.and_then(|open| open.quant) {
            self.quant_traces[at].add_error(trace);
            return;
        }
        match self.quant_traces.last_mut() {
            Some(loose) if loose.position.is_none() && self.open.is_none() => {
                loose.add_error(trace)
            }
            _ => self.quant_traces.push(ModelQuantizationError {
                position: None,
                traces: vec![trace],
            }),
        }
    }

    /// Accounts `bytes` for a record about to be kept; `false` (and the record counted as
    /// dropped) when that would pass the memory limit.
    fn reserve(&mut self, bytes: usize) -> bool {
        if self.summary_only
            || self.retained_bytes.saturating_add(bytes) > self.config.memory_limit_bytes
        {
            self.not_kept();
            return false;
        }
        self.retained_bytes += bytes;
        true
    }

    /// Counts a record that was not kept as dropped, unless no record is kept by design.
    fn not_kept(&mut self) {
        if !self.summary_only {
            self.totals.dropped += 1;
        }
    }

    // -----------------------------------------------------------------------------------------
    // What it holds
    // -----------------------------------------------------------------------------------------

    /// Activation traces, one per forward pass with activations traced.
    pub fn activation_traces(&self) -> &[ModelActivationTrace] {
        &self.activation_traces
    }

    /// Attention records, in recording order.
    pub fn attention_traces(&self) -> &[AttentionWeightTrace] {
        &self.attention_traces
    }

    /// Logit traces, one per forward pass (and batch row) that recorded logits with a token to
    /// follow: without `tracked_tokens`, a pass whose final logits are all NaN ranks no token and
    /// has none (its anomaly says so).
    pub fn logit_traces(&self) -> &[LogitEvolutionTrace] {
        &self.logit_traces
    }

    /// The KV-cache session.
    pub fn kv_trace(&self) -> &KvCacheSessionTrace {
        &self.kv_trace
    }

    /// Quantization errors, one set per forward pass (plus sets of records made outside a pass).
    pub fn quant_traces(&self) -> &[ModelQuantizationError] {
        &self.quant_traces
    }

    /// Router calls ([`trace_router`](crate::ModelTracerConfig::trace_router)), in recording
    /// order: per token the experts chosen and how close the choice was, per expert its load.
    pub fn routers(&self) -> &[RouterEvent] {
        &self.router_traces
    }

    /// Forward passes begun since creation or the last `clear`.
    pub fn forward_passes(&self) -> usize {
        self.forward_passes
    }

    /// Records counted but not kept because of the memory limit.
    pub fn records_dropped(&self) -> usize {
        self.totals.dropped
    }

    /// Estimated heap bytes of the records kept.
    pub fn retained_bytes(&self) -> usize {
        self.retained_bytes
    }

    /// Drops every finished record and resets the totals; the open pass, if any, carries on
    /// with what it recorded so far.
    pub fn clear(&mut self) {
        let open = self.open.take();
        let activations = open
            .and_then(|o| o.activations)
            .map(|at| self.activation_traces.swap_remove(at));
        let quant = open
            .and_then(|o| o.quant)
            .map(|at| self.quant_traces.swap_remove(at));
        self.activation_traces.clear();
        self.attention_traces.clear();
        self.logit_traces.clear();
        self.quant_traces.clear();
        self.router_traces.clear();
        self.kv_trace = KvCacheSessionTrace::default();
        self.totals = Totals::default();
        self.retained_bytes = 0;
        self.forward_passes = 0;
        if let Some(open) = open {
            self.open_pass(open.position);
            if let Some(now) = &mut self.open {
                now.layers = open.layers;
                if let (Some(at), Some(kept)) = (now.activations, activations) {
                    self.retained_bytes +=
                        kept.layers.iter().map(heap_size_of_layer).sum::<usize>();
                    self.activation_traces[at] = kept;
                }
                if let (Some(at), Some(kept)) = (now.quant, quant) {
                    self.retained_bytes +=
                        kept.traces.iter().map(heap_size_of_quant).sum::<usize>();
                    self.quant_traces[at] = kept;
                }
            }
        }
    }

    /// Totals over everything recorded, kept or not.
    pub fn summary(&self) -> ModelTracerSummary {
        self.totals.summary(self)
    }

    /// The summary as one line of JSON.
    pub fn summary_to_json(&self) -> String {
        match serde_json::to_string(&self.summary()) {
            Ok(json) => json,
            // The summary holds only numbers, strings and options; keep the output JSON even if
            // that ever stops being true.
            Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
        }
    }
}

impl TraceSink for ModelTracer {
    fn name(&self) -> Cow<'_, str> {
        Cow::Borrowed("in-memory tracer")
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.accept(event);
        Ok(())
    }
}

fn heap_size_of_layer(trace: &LayerActivationTrace) -> usize {
    std::mem::size_of::<LayerActivationTrace>()
        + trace
            .stages
            .iter()
            .map(|(name, _)| std::mem::size_of::<(String, TensorStats)>() + name.len())
            .sum::<usize>()
}

fn heap_size_of_attention(trace: &AttentionWeightTrace) -> usize {
    std::mem::size_of::<AttentionWeightTrace>() + trace.top_k_positions.len() * 12
}

fn heap_size_of_quant(trace: &QuantizationErrorTrace) -> usize {
    std::mem::size_of::<QuantizationErrorTrace>() + trace.site.len()
}

fn heap_size_of_router(event: &RouterEvent) -> usize {
    let token = |t: &crate::record::RoutedToken| {
        std::mem::size_of_val(t) + (t.experts.len() + t.weights.len() + t.logits.len()) * 4
    };
    std::mem::size_of::<RouterEvent>()
        + event.tracepoint.len()
        + event.function.len()
        + event.load.len() * std::mem::size_of::<usize>()
        + event.tokens.iter().map(token).sum::<usize>()
}

fn heap_size_of_logits(trace: &LogitEvolutionTrace) -> usize {
    std::mem::size_of::<LogitEvolutionTrace>()
        + trace
            .tracked_tokens
            .iter()
            .map(|t| std::mem::size_of_val(t) + t.token_text.len() + t.layers.len() * 20)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{KvCacheStateTrace, QuantizationErrorTrace};

    fn logits_with_order(vocab: usize, order: &[u32]) -> Vec<f32> {
        // tokens in `order` get the highest logits, first is best
        let mut row = vec![0.0; vocab];
        for (i, &t) in order.iter().enumerate() {
            row[t as usize] = 100.0 - i as f32;
        }
        row
    }

    #[test]
    fn tracked_tokens_are_used() {
        let mut tracer = ModelTracer::new(ModelTracerConfig {
            trace_logits: true,
            tracked_tokens: Some(vec![7, 3]),
            ..ModelTracerConfig::default()
        });
        tracer.begin_forward(11);
        tracer.record_logits(0, &logits_with_order(10, &[1, 2, 3, 7]));
        tracer.record_logits(1, &logits_with_order(10, &[7, 3]));
        assert!(tracer.end_forward().is_none());
        let trace = &tracer.logit_traces()[0];
        assert_eq!(trace.position, 11);
        let ids: Vec<u32> = trace.tracked_tokens.iter().map(|t| t.token_id).collect();
        assert_eq!(ids, [7, 3]);
        assert_eq!(trace.tracked_tokens[0].ranks_by_layer, [3, 0]);
        assert_eq!(trace.tracked_tokens[1].ranks_by_layer, [2, 1]);
        // end_forward finalized the trace: token 7 wins and rose at layer 1
        assert_eq!(trace.decisive_layer, Some(1));
    }

    #[test]
    fn auto_tracks_the_final_layers_top_k_across_a_logit_lens() {
        let mut tracer = ModelTracer::new(ModelTracerConfig {
            trace_logits: true,
            auto_track_top_k: 3,
            ..ModelTracerConfig::default()
        });
        for pass in 0..2 {
            tracer.begin_forward(pass);
            // recorded out of layer order; layer 29 is final
            tracer.record_logits(10, &logits_with_order(50, &[1, 2, 3, 4, 5, 6, 40]));
            tracer.record_logits(29, &logits_with_order(50, &[40, 6, 2]));
            tracer.record_logits(20, &logits_with_order(50, &[6, 40, 1]));
            tracer.end_forward();
        }
        assert_eq!(tracer.logit_traces().len(), 2);
        for trace in tracer.logit_traces() {
            let ids: Vec<u32> = trace.tracked_tokens.iter().map(|t| t.token_id).collect();
            assert_eq!(ids, [40, 6, 2]);
            let winner = &trace.tracked_tokens[0];
            assert_eq!(winner.layers, [10, 29, 20]);
            assert_eq!(winner.ranks_by_layer, [6, 0, 1]);
            // 6 -> 0 at layer 29 is the largest gain (records are compared in recording order)
            assert_eq!(trace.decisive_layer, Some(29));
        }
    }

    #[test]
    fn logits_without_a_pass_or_records_leave_no_trace() {
        let mut tracer = ModelTracer::new(ModelTracerConfig::full());
        tracer.record_logits(0, &[1.0, 2.0]);
        tracer.begin_forward(0);
        tracer.end_forward();
        assert!(tracer.logit_traces().is_empty());
        assert_eq!(tracer.forward_passes(), 1);
    }

    #[test]
    fn anomaly_at_the_right_layer_and_pass() {
        let mut tracer = ModelTracer::new(ModelTracerConfig::lightweight());
        for pos in 0..3 {
            tracer.begin_forward(pos);
            for i in 0..30 {
                let mut layer = LayerActivationTrace::new(i);
                layer.set_stage("input", TensorStats::from_slice(&[1.0, -1.0, 2.0]));
                let mut out = [1.5, -0.5, 2.5];
                if pos == 1 && i >= 17 {
                    out[1] = f32::NAN; // propagates to every later layer
                }
                layer.set_stage("output", TensorStats::from_slice(&out));
                tracer.record_layer_activation(layer);
            }
            let anomaly = tracer.end_forward();
            assert_eq!(anomaly.is_some(), pos == 1);
        }
        let summary = tracer.summary();
        assert_eq!(summary.anomalies_detected, 1);
        assert_eq!(summary.first_anomaly_position, Some(1));
        assert_eq!(
            summary.first_anomaly.as_deref(),
            Some("layer 17 output: NaN (1 of 3 values)")
        );
        assert_eq!(summary.layers_per_pass, 30);
        assert_eq!(tracer.activation_traces()[1].anomaly_layer, Some(17));
    }

    #[test]
    fn records_outside_a_pass() {
        let mut tracer = ModelTracer::new(ModelTracerConfig::full());
        assert_eq!(tracer.end_forward(), None);
        tracer.record_layer_activation(LayerActivationTrace::new(0));
        tracer.record_attention_weights(0, 0, 1, &[0.9, 0.1]);
        tracer.record_kv_state(KvCacheStateTrace::new(0, 16));
        let q = |site: &str| {
            QuantizationErrorTrace::compute(site, 0, &[1.0], &[1.0], crate::record::QuantType::Q8_0)
                .unwrap()
        };
        tracer.record_quant_error(q("a"));
        tracer.record_quant_error(q("b"));
        tracer.begin_forward(0);
        tracer.record_quant_error(q("c"));
        tracer.begin_forward(1); // ends pass 0
        tracer.end_forward();
        tracer.record_quant_error(q("d"));
        assert!(tracer
            .activation_traces()
            .iter()
            .all(|t| t.layers.is_empty()));
        assert_eq!(tracer.attention_traces().len(), 1);
        assert_eq!(tracer.kv_trace().steps.len(), 1);
        let groups: Vec<(Option<usize>, usize)> = tracer
            .quant_traces()
            .iter()
            .map(|g| (g.position, g.traces.len()))
            .collect();
        assert_eq!(groups, [(None, 2), (Some(0), 1), (Some(1), 0), (None, 1)]);
        assert_eq!(tracer.forward_passes(), 2);
    }

    #[test]
    fn disabled_kinds_record_nothing_and_filters_apply() {
        let mut tracer = ModelTracer::new(ModelTracerConfig::default());
        tracer.begin_forward(0);
        tracer.record_layer_activation(LayerActivationTrace::new(0));
        tracer.record_attention(AttentionWeightTrace::from_weights(0, 0, 0, &[1.0], 5));
        tracer.record_logits(0, &[1.0]);
        tracer.record_kv_state(KvCacheStateTrace::new(0, 1));
        tracer.end_forward();
        assert!(tracer.activation_traces().is_empty() && tracer.attention_traces().is_empty());
        assert!(tracer.logit_traces().is_empty() && tracer.quant_traces().is_empty());
        assert!(tracer.kv_trace().steps.is_empty());

        let mut config = ModelTracerConfig::full();
        config.attention_config.layers = Some(vec![2]);
        let mut tracer = ModelTracer::new(config);
        tracer.record_attention(AttentionWeightTrace::from_weights(1, 0, 0, &[1.0], 5));
        tracer.record_attention(AttentionWeightTrace::from_weights(2, 0, 0, &[1.0], 5));
        tracer.record_attention_weights(3, 0, 0, &[1.0]);
        assert_eq!(tracer.attention_traces().len(), 1);
    }

    fn full_tracer() -> ModelTracer {
        let mut tracer = ModelTracer::new(ModelTracerConfig::full());
        for pos in 0..2 {
            tracer.begin_forward(pos);
            for i in 0..4 {
                let mut layer = LayerActivationTrace::new(i);
                layer.set_stage("input", TensorStats::from_slice(&[1.0, 2.0, -3.0]));
                layer.set_stage("q_proj", TensorStats::from_slice(&[0.5, 0.25]));
                layer.set_stage("output", TensorStats::from_slice(&[1.5, 2.0, -2.0]));
                tracer.record_layer_activation(layer);
                tracer.record_attention_weights(i, 0, pos, &[0.6, 0.1, 0.1, 0.1, 0.1]);
                let third = if i == 0 { f32::NAN } else { 0.5 };
                tracer.record_logits(i, &[0.1 * i as f32, 1.0, third, -1.0]);
            }
            tracer.record_quant_error(
                QuantizationErrorTrace::compute(
                    "ffn",
                    2,
                    &[1.0, 2.01],
                    &[1.0, 2.0],
                    crate::record::QuantType::Q4_K,
                )
                .unwrap(),
            );
            let mut kv = KvCacheStateTrace::new(pos, 8);
            kv.valid_positions = pos + 1;
            kv.cache_size_bytes = 1024 * (pos + 1);
            kv.cache_hit_rate = Some(0.9);
            tracer.record_kv_state(kv);
            tracer.end_forward();
        }
        tracer
    }

    #[test]
    fn serde_round_trip_of_every_record() {
        let tracer = full_tracer();
        let json = serde_json::to_string(&tracer).unwrap();
        let back: ModelTracer = serde_json::from_str(&json).unwrap();
        assert_eq!(back.config(), tracer.config());
        assert_eq!(back.activation_traces(), tracer.activation_traces());
        assert_eq!(back.attention_traces(), tracer.attention_traces());
        assert_eq!(back.quant_traces(), tracer.quant_traces());
        assert_eq!(back.kv_trace(), tracer.kv_trace());
        assert_eq!(back.forward_passes(), 2);
        // token 2 is tracked automatically and its layer-0 logit is NaN, which PartialEq cannot compare
        assert_eq!(
            serde_json::to_string(back.logit_traces()).unwrap(),
            serde_json::to_string(tracer.logit_traces()).unwrap()
        );
        assert_eq!(back.summary(), tracer.summary());
        let summary: ModelTracerSummary = serde_json::from_str(&tracer.summary_to_json()).unwrap();
        assert_eq!(summary, tracer.summary());
    }

    #[test]
    fn summary_counts_and_display() {
        let mut tracer = full_tracer();
        let s = tracer.summary();
        // Each pass's layer-0 logits hold a NaN.
        assert_eq!(
            (s.total_forwards, s.layers_per_pass, s.anomalies_detected),
            (2, 4, 2)
        );
        assert_eq!((s.attention_traces, s.logit_traces), (8, 2));
        assert_eq!(
            (s.kv_steps, s.peak_memory_bytes, s.avg_hit_rate),
            (2, 2048, Some(0.9))
        );
        assert_eq!(
            (s.quant_traces, s.worst_quant_site.as_deref()),
            (2, Some("ffn"))
        );
        let text = s.to_string();
        for line in [
            "Forward passes: 2",
            "Layers per pass: 4",
            "Anomalies: 2 (first at position 0: layer 0 logits: NaN (1 of 4 values))",
            "Attention: 8 rows, 4 heads in 4 layers (bidirectional)",
            "first-token sink: 4 heads: L0.H0, L1.H0, L2.H0, L3.H0",
            "KV peak memory: 2.0 KiB",
            "Avg hit rate: 90.00%",
            "KV thrashing: no",
            "Worst quant cosine: ",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        tracer.clear();
        assert_eq!(
            tracer.summary(),
            ModelTracerSummary {
                memory_limit_bytes: crate::config::DEFAULT_MEMORY_LIMIT_BYTES,
                attention_traced: true,
                logits_traced: true,
                kv_cache_traced: true,
                quant_traced: true,
                ..ModelTracerSummary::default()
            }
        );
        assert!(tracer.summary().to_string().contains("Avg hit rate: n/a"));
    }

    #[test]
    fn the_summary_shows_only_the_kinds_traced() {
        let activations_only = ModelTracerConfig {
            trace_activations: true,
            ..ModelTracerConfig::default()
        };
        let text = ModelTracer::new(activations_only).summary().to_string();
        assert!(text.contains("Anomalies: 0"), "{text}");
        for absent in ["Attention", "Logit", "KV", "Avg hit rate", "Quant"] {
            assert!(!text.contains(absent), "{absent:?} in\n{text}");
        }
        let light = ModelTracer::new(ModelTracerConfig::lightweight()).summary();
        let text = light.to_string();
        assert!(text.contains("KV cache steps: 0"), "{text}");
        assert!(
            !text.contains("Quant") && !text.contains("Attention"),
            "{text}"
        );
        // A summary read back without the flags still shows what was recorded.
        let recorded = ModelTracerSummary {
            quant_traces: 3,
            ..ModelTracerSummary::default()
        };
        assert!(recorded.to_string().contains("Quant traces: 3"));
    }

    #[test]
    fn non_finite_logits_recorded_by_hand_are_an_anomaly_and_rank_nothing() {
        let mut tracer = ModelTracer::new(ModelTracerConfig {
            trace_logits: true,
            auto_track_top_k: 2,
            ..ModelTracerConfig::default()
        });
        tracer.begin_forward(0);
        tracer.record_logits(3, &[f32::NAN, 1.0, 3.0, f32::NAN]);
        let anomaly = tracer.end_forward();
        assert_eq!(
            anomaly.as_deref(),
            Some("layer 3 logits: NaN (2 of 4 values)")
        );
        let ranks: Vec<(u32, usize)> = tracer.logit_traces()[0]
            .tracked_tokens
            .iter()
            .map(|t| (t.token_id, t.ranks_by_layer[0]))
            .collect();
        assert_eq!(ranks, [(2, 0), (1, 1)]);
        tracer.begin_forward(1);
        tracer.record_logits(3, &[f32::NAN; 4]);
        assert!(tracer.end_forward().is_some());
        assert_eq!(tracer.summary().anomalies_detected, 2);
    }

    #[test]
    fn a_compiled_out_tracer_says_so_in_one_line() {
        let summary = ModelTracer::compiled_out(ModelTracerConfig::full()).summary();
        assert!(summary.tracing_compiled_out);
        assert_eq!(
            summary.to_string(),
            "ModelTracer Summary: tracing is compiled out: build with --features enabled \
             (or your crate's feature forwarding to it)"
        );
        let json = ModelTracer::compiled_out(ModelTracerConfig::full()).summary_to_json();
        assert!(json.contains(r#""tracing_compiled_out":true"#), "{json}");
        assert!(!ModelTracer::new(ModelTracerConfig::full())
            .summary_to_json()
            .contains("compiled_out"));
    }

    #[test]
    fn past_the_memory_limit_records_are_counted_not_kept() {
        let config = ModelTracerConfig {
            memory_limit_bytes: 4096,
            ..ModelTracerConfig::full()
        };
        let mut tracer = ModelTracer::new(config);
        for pass in 0..50 {
            tracer.begin_forward(pass);
            for layer in 0..4 {
                let mut trace = LayerActivationTrace::new(layer);
                trace.set_stage("input", TensorStats::from_slice(&[1.0, 2.0]));
                trace.set_stage("output", TensorStats::from_slice(&[1.0, f32::NAN]));
                tracer.record_layer_activation(trace);
                tracer.record_attention_weights(layer, 0, 1, &[0.5, 0.5]);
            }
            tracer.end_forward();
        }
        assert!(
            tracer.retained_bytes() <= 4096,
            "{}",
            tracer.retained_bytes()
        );
        assert!(tracer.records_dropped() > 0);
        let summary = tracer.summary();
        // the summary still covers every record
        assert_eq!(summary.total_forwards, 50);
        assert_eq!(summary.anomalies_detected, 50);
        assert_eq!(summary.attention_traces, 200);
        assert_eq!(summary.layers_per_pass, 4);
        assert_eq!(summary.records_dropped, tracer.records_dropped());
        let text = summary.to_string();
        assert!(text.contains("Records not kept in memory:"), "{text}");
        assert!(text.contains("past the 4.0 KiB limit"), "{text}");
    }
}
