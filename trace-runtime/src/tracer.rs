//! `ModelTracer`: the five kinds of records of a run, grouped by forward pass.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::activation::{LayerActivationTrace, ModelActivationTrace};
use crate::attention::{
    top_k_by_selection, AttentionTraceConfig, AttentionWeightTrace, ATTENTION_SINK_THRESHOLD,
};
use crate::kv_cache::{
    KvCacheSessionTrace, KvCacheStateTrace, DEFAULT_THRASHING_EVICTIONS_PER_STEP,
    DEFAULT_THRASHING_WINDOW,
};
use crate::logit::LogitEvolutionTrace;
use crate::quant::{ModelQuantizationError, QuantizationErrorTrace};

/// What a [`ModelTracer`] records. `default()` records nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelTracerConfig {
    /// Per-layer activation statistics and the anomaly rules.
    pub trace_activations: bool,
    /// Sparse attention rows.
    pub trace_attention: bool,
    /// Which attention rows, and how much of each.
    pub attention_config: AttentionTraceConfig,
    /// Rank of tokens through the layers (logit lens).
    pub trace_logits: bool,
    /// Tokens whose logits are followed; `None` follows the `auto_track_top_k` top tokens of
    /// the final layer of each pass.
    pub tracked_tokens: Option<Vec<u32>>,
    /// How many final top tokens to follow when `tracked_tokens` is `None`.
    pub auto_track_top_k: usize,
    /// Error of quantized computations against a reference (runs the reference: expensive).
    pub trace_quant_error: bool,
    /// KV-cache state per step.
    pub trace_kv_cache: bool,
}

impl Default for ModelTracerConfig {
    fn default() -> Self {
        Self {
            trace_activations: false,
            trace_attention: false,
            attention_config: AttentionTraceConfig::default(),
            trace_logits: false,
            tracked_tokens: None,
            auto_track_top_k: 5,
            trace_quant_error: false,
            trace_kv_cache: false,
        }
    }
}

impl ModelTracerConfig {
    /// Everything on, automatic token choice (for debugging).
    pub fn full() -> Self {
        Self {
            trace_activations: true,
            trace_attention: true,
            trace_logits: true,
            trace_quant_error: true,
            trace_kv_cache: true,
            ..Self::default()
        }
    }

    /// Activations and KV cache only: the cheap records that catch most failures.
    pub fn lightweight() -> Self {
        Self {
            trace_activations: true,
            trace_kv_cache: true,
            ..Self::default()
        }
    }

    /// Whether anything is recorded at all.
    pub fn is_enabled(&self) -> bool {
        self.trace_activations
            || self.trace_attention
            || self.trace_logits
            || self.trace_quant_error
            || self.trace_kv_cache
    }
}

/// Records of the forward pass in progress.
#[derive(Debug, Clone, Default)]
struct ForwardPass {
    position: usize,
    activations: Option<ModelActivationTrace>,
    logits: Option<LogitEvolutionTrace>,
    /// Automatic token choice: each recorded logit row, kept until `end_forward` knows the
    /// final layer's top tokens.
    pending_logit_rows: Vec<(usize, Vec<f32>)>,
    quant: Option<ModelQuantizationError>,
}

/// Collects the records of a run, grouped by forward pass.
///
/// Call [`begin_forward`](Self::begin_forward) before a pass and [`end_forward`](Self::end_forward)
/// after it; record with the `record_*` methods in between. What a record needs:
///
/// * Activations and logits belong to a pass: recorded outside one, they are dropped.
/// * Attention rows, KV-cache steps and quantization errors stand on their own and are kept
///   outside a pass too (quantization errors made outside a pass are grouped under
///   `position: None`).
/// * Nothing panics, whatever the order of calls: `end_forward` without a pass returns `None`,
///   `begin_forward` during a pass first ends the open one.
///
/// Logit tracking: with `tracked_tokens` set, each `record_logits` call ranks those tokens
/// immediately. Without it, the tracer copies each row and, at `end_forward`, picks the
/// `auto_track_top_k` best tokens of the final layer (the highest `layer_idx` recorded in the
/// pass) and ranks them in every recorded layer, so the trace shows how the eventual winners
/// rose. The copies (one vocabulary row per recorded layer) live only until `end_forward` and
/// their buffers are reused by the next pass.
///
/// The tracer serializes with serde (the pass in progress is not included).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModelTracer {
    config: ModelTracerConfig,
    forward_passes: usize,
    activation_traces: Vec<ModelActivationTrace>,
    attention_traces: Vec<AttentionWeightTrace>,
    logit_traces: Vec<LogitEvolutionTrace>,
    quant_traces: Vec<ModelQuantizationError>,
    kv_trace: KvCacheSessionTrace,
    #[serde(skip)]
    pass: Option<ForwardPass>,
    #[serde(skip)]
    spare_rows: Vec<Vec<f32>>,
}

impl ModelTracer {
    /// A tracer recording what `config` asks for.
    pub fn new(config: ModelTracerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ModelTracerConfig {
        &self.config
    }

    /// Starts a forward pass for the token at `position` (ending the open one first, if any).
    pub fn begin_forward(&mut self, position: usize) {
        if self.pass.is_some() {
            self.end_forward();
        }
        self.forward_passes += 1;
        let activations = self.config.trace_activations.then(|| ModelActivationTrace {
            position,
            ..ModelActivationTrace::default()
        });
        let logits = self.config.trace_logits.then(|| {
            let mut trace = LogitEvolutionTrace::new(position, 1.0, 1.0);
            for &token in self.config.tracked_tokens.iter().flatten() {
                trace.track_token(token, String::new());
            }
            trace
        });
        let quant = self
            .config
            .trace_quant_error
            .then(|| ModelQuantizationError::for_position(position));
        self.pass = Some(ForwardPass {
            position,
            activations,
            logits,
            pending_logit_rows: Vec::new(),
            quant,
        });
    }

    /// Whether a forward pass is open.
    pub fn in_forward(&self) -> bool {
        self.pass.is_some()
    }

    /// Position of the open forward pass.
    pub fn current_position(&self) -> Option<usize> {
        self.pass.as_ref().map(|p| p.position)
    }

    /// Layers recorded so far in the open pass (when activations are traced).
    pub fn current_activation_trace(&self) -> Option<&ModelActivationTrace> {
        self.pass.as_ref()?.activations.as_ref()
    }

    /// The logit trace of the open pass (with explicit `tracked_tokens`; with the automatic
    /// choice the tokens are only known at `end_forward`).
    pub fn current_logit_trace(&self) -> Option<&LogitEvolutionTrace> {
        self.pass.as_ref()?.logits.as_ref()
    }

    /// Adds one layer's record to the open pass.
    pub fn record_layer_activation(&mut self, trace: LayerActivationTrace) {
        if let Some(activations) = self.pass.as_mut().and_then(|p| p.activations.as_mut()) {
            activations.add_layer(trace);
        }
    }

    /// Keeps an attention record if attention is traced and its layer and head pass the filters.
    pub fn record_attention(&mut self, trace: AttentionWeightTrace) {
        let filter = &self.config.attention_config;
        if self.config.trace_attention
            && filter.should_trace_layer(trace.layer_idx)
            && filter.should_trace_head(trace.head_idx)
        {
            self.attention_traces.push(trace);
        }
    }

    /// Records one query row of attention probabilities with the configured `top_k` and
    /// `weight_threshold`; nothing is computed for filtered-out layers and heads.
    pub fn record_attention_weights(
        &mut self,
        layer_idx: usize,
        head_idx: usize,
        query_pos: usize,
        weights: &[f32],
    ) {
        if !self.config.trace_attention {
            return;
        }
        if let Some(trace) = self
            .config
            .attention_config
            .trace_row(layer_idx, head_idx, query_pos, weights)
        {
            self.attention_traces.push(trace);
        }
    }

    /// Records one vocabulary row of logits as seen at layer `layer_idx` (for `[seq, vocab]`
    /// logits pass the row of the position being predicted). Call it once per probed layer; the
    /// final layer is the highest index. Ignored outside a pass.
    pub fn record_logits(&mut self, layer_idx: usize, logits: &[f32]) {
        let Some(pass) = self.pass.as_mut() else {
            return;
        };
        let Some(trace) = pass.logits.as_mut() else {
            return;
        };
        if self.config.tracked_tokens.is_some() {
            trace.record_logits(layer_idx, logits);
        } else {
            let mut row = self.spare_rows.pop().unwrap_or_default();
            row.clear();
            row.extend_from_slice(logits);
            pass.pending_logit_rows.push((layer_idx, row));
        }
    }

    /// Adds a KV-cache step to the session.
    pub fn record_kv_state(&mut self, trace: KvCacheStateTrace) {
        if self.config.trace_kv_cache {
            self.kv_trace.add_step(trace);
        }
    }

    /// Adds a quantization error to the open pass's set, or outside a pass to a set with
    /// `position: None` (consecutive such records share one set).
    pub fn record_quant_error(&mut self, trace: QuantizationErrorTrace) {
        if !self.config.trace_quant_error {
            return;
        }
        if let Some(quant) = self.pass.as_mut().and_then(|p| p.quant.as_mut()) {
            quant.add_error(trace);
            return;
        }
        match self.quant_traces.last_mut() {
            Some(loose) if loose.position.is_none() => loose.add_error(trace),
            _ => self.quant_traces.push(ModelQuantizationError {
                position: None,
                traces: vec![trace],
            }),
        }
    }

    /// Ends the open pass: runs the anomaly rules over its layers, resolves and finalizes its
    /// logit trace (decisive layer), and files its quantization set. Returns the pass's anomaly
    /// (see [`ModelActivationTrace`] for the rules), or `None` when there is none or no pass is open.
    pub fn end_forward(&mut self) -> Option<String> {
        let mut pass = self.pass.take()?;
        let mut anomaly = None;
        if let Some(mut activations) = pass.activations.take() {
            activations.finalize();
            anomaly.clone_from(&activations.anomaly_desc);
            self.activation_traces.push(activations);
        }
        if let Some(mut logits) = pass.logits.take() {
            if !pass.pending_logit_rows.is_empty() {
                self.track_final_top_k(&mut logits, &pass.pending_logit_rows);
            }
            logits.finalize();
            if logits.layers_recorded() > 0 {
                self.logit_traces.push(logits);
            }
        }
        self.spare_rows
            .extend(pass.pending_logit_rows.drain(..).map(|(_, row)| row));
        if let Some(quant) = pass.quant.take() {
            self.quant_traces.push(quant);
        }
        anomaly
    }

    /// Tracks the best tokens of the final recorded layer and ranks them in every recorded row.
    fn track_final_top_k(&self, logits: &mut LogitEvolutionTrace, rows: &[(usize, Vec<f32>)]) {
        // The final layer: highest index, the later record on ties.
        let final_row = rows
            .iter()
            .enumerate()
            .max_by_key(|(i, (layer, _))| (*layer, *i))
            .map(|(_, (_, row))| row.as_slice())
            .unwrap_or_default();
        let (mut positions, mut values) = (Vec::new(), Vec::new());
        top_k_by_selection(
            final_row,
            self.config.auto_track_top_k,
            f32::NEG_INFINITY,
            &mut positions,
            &mut values,
        );
        for token in positions.into_iter().filter_map(|p| u32::try_from(p).ok()) {
            logits.track_token(token, String::new());
        }
        for (layer, row) in rows {
            logits.record_logits(*layer, row);
        }
    }

    /// Activation traces, one per forward pass with activations traced.
    pub fn activation_traces(&self) -> &[ModelActivationTrace] {
        &self.activation_traces
    }

    /// Attention records, in recording order.
    pub fn attention_traces(&self) -> &[AttentionWeightTrace] {
        &self.attention_traces
    }

    /// Logit traces, one per forward pass that recorded logits.
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

    /// Forward passes begun since creation or the last `clear`.
    pub fn forward_passes(&self) -> usize {
        self.forward_passes
    }

    /// Drops every finished record (the open pass, if any, carries on).
    pub fn clear(&mut self) {
        self.forward_passes = usize::from(self.pass.is_some());
        self.activation_traces.clear();
        self.attention_traces.clear();
        self.logit_traces.clear();
        self.quant_traces.clear();
        self.kv_trace = KvCacheSessionTrace::default();
    }

    /// Totals over everything recorded.
    pub fn summary(&self) -> ModelTracerSummary {
        let first_anomaly = self.activation_traces.iter().find(|t| t.has_anomaly);
        let all_quant = || self.quant_traces.iter().flat_map(|q| &q.traces);
        let worst = self
            .quant_traces
            .iter()
            .filter_map(ModelQuantizationError::worst)
            .min_by(|a, b| {
                (b.non_finite > 0)
                    .cmp(&(a.non_finite > 0))
                    .then(a.cosine_similarity.total_cmp(&b.cosine_similarity))
            });
        ModelTracerSummary {
            total_forwards: self.forward_passes,
            layers_per_pass: self
                .activation_traces
                .iter()
                .map(|t| t.layers.len())
                .max()
                .unwrap_or(0),
            anomalies_detected: self
                .activation_traces
                .iter()
                .filter(|t| t.has_anomaly)
                .count(),
            first_anomaly_position: first_anomaly.map(|t| t.position),
            first_anomaly: first_anomaly.and_then(|t| t.anomaly_desc.clone()),
            attention_traces: self.attention_traces.len(),
            attention_sinks: self
                .attention_traces
                .iter()
                .filter(|t| t.is_attention_sink(ATTENTION_SINK_THRESHOLD))
                .count(),
            logit_traces: self.logit_traces.len(),
            kv_steps: self.kv_trace.steps.len(),
            total_evictions: self.kv_trace.total_evictions,
            peak_memory_bytes: self.kv_trace.peak_memory_bytes,
            avg_hit_rate: self.kv_trace.hit_rate(),
            kv_thrashing: self.kv_trace.has_thrashing(
                DEFAULT_THRASHING_WINDOW,
                DEFAULT_THRASHING_EVICTIONS_PER_STEP,
            ),
            quant_traces: all_quant().count(),
            quant_warnings: all_quant().filter(|t| t.is_warning()).count(),
            quant_criticals: all_quant().filter(|t| t.is_critical()).count(),
            worst_quant_cosine: worst.map(|t| t.cosine_similarity),
            worst_quant_site: worst.map(|t| t.site.clone()),
        }
    }

    /// The summary as one line of JSON.
    pub fn summary_to_json(&self) -> String {
        match serde_json::to_string(&self.summary()) {
            Ok(json) => json,
            // The summary holds only finite numbers, strings and options; keep the output JSON
            // even if that ever stops being true.
            Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
        }
    }
}

/// Totals of a [`ModelTracer`]; `Display` prints a short report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelTracerSummary {
    /// Forward passes begun.
    pub total_forwards: usize,
    /// Most layers recorded in one pass.
    pub layers_per_pass: usize,
    /// Passes with an activation anomaly.
    pub anomalies_detected: usize,
    /// Description of the first pass's anomaly.
    pub first_anomaly: Option<String>,
    /// Position of the first pass with an anomaly.
    pub first_anomaly_position: Option<usize>,
    /// Attention rows recorded.
    pub attention_traces: usize,
    /// Rows with at least `ATTENTION_SINK_THRESHOLD` weight on position 0.
    pub attention_sinks: usize,
    /// Passes with a logit trace.
    pub logit_traces: usize,
    /// KV-cache steps recorded.
    pub kv_steps: usize,
    /// Positions evicted over the session.
    pub total_evictions: usize,
    /// Largest cache size seen.
    pub peak_memory_bytes: usize,
    /// Mean hit rate over the steps that reported one.
    pub avg_hit_rate: Option<f32>,
    /// `has_thrashing(DEFAULT_THRASHING_WINDOW, DEFAULT_THRASHING_EVICTIONS_PER_STEP)`.
    pub kv_thrashing: bool,
    /// Quantization sites compared, over all passes.
    pub quant_traces: usize,
    /// Sites in the warning band.
    pub quant_warnings: usize,
    /// Critical sites.
    pub quant_criticals: usize,
    /// Lowest cosine similarity of any site.
    pub worst_quant_cosine: Option<f32>,
    /// Site of the lowest cosine similarity.
    pub worst_quant_site: Option<String>,
}

impl fmt::Display for ModelTracerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ModelTracer Summary:")?;
        writeln!(f, "  Forward passes: {}", self.total_forwards)?;
        writeln!(f, "  Layers per pass: {}", self.layers_per_pass)?;
        write!(f, "  Anomalies: {}", self.anomalies_detected)?;
        if let Some(desc) = &self.first_anomaly {
            match self.first_anomaly_position {
                Some(p) => write!(f, " (first at position {p}: {desc})")?,
                None => write!(f, " (first: {desc})")?,
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "  Attention traces: {} ({} attention sinks)",
            self.attention_traces, self.attention_sinks
        )?;
        writeln!(f, "  Logit traces: {}", self.logit_traces)?;
        writeln!(f, "  KV cache steps: {}", self.kv_steps)?;
        writeln!(f, "  KV evictions: {}", self.total_evictions)?;
        writeln!(f, "  KV peak memory: {}", ByteSize(self.peak_memory_bytes))?;
        match self.avg_hit_rate {
            Some(rate) => writeln!(f, "  Avg hit rate: {:.2}%", rate * 100.0)?,
            None => writeln!(f, "  Avg hit rate: n/a")?,
        }
        writeln!(
            f,
            "  KV thrashing: {}",
            if self.kv_thrashing { "yes" } else { "no" }
        )?;
        writeln!(f, "  Quant traces: {}", self.quant_traces)?;
        writeln!(f, "  Quant warnings: {}", self.quant_warnings)?;
        write!(f, "  Quant criticals: {}", self.quant_criticals)?;
        if let (Some(cos), Some(site)) = (self.worst_quant_cosine, &self.worst_quant_site) {
            write!(f, "\n  Worst quant cosine: {cos:.6} ({site})")?;
        }
        Ok(())
    }
}

/// Bytes with a binary unit, for the report.
struct ByteSize(usize);

impl fmt::Display for ByteSize {
    #[allow(clippy::cast_precision_loss)]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::TensorStats;

    fn logits_with_order(vocab: usize, order: &[u32]) -> Vec<f32> {
        // tokens in `order` get the highest logits, first is best
        let mut row = vec![0.0; vocab];
        for (i, &t) in order.iter().enumerate() {
            row[t as usize] = 100.0 - i as f32;
        }
        row
    }

    #[test]
    fn configs() {
        let none = ModelTracerConfig::default();
        assert!(!none.is_enabled());
        assert_eq!(none.auto_track_top_k, 5);
        let light = ModelTracerConfig::lightweight();
        assert!(light.trace_activations && light.trace_kv_cache);
        assert!(!light.trace_attention && !light.trace_logits && !light.trace_quant_error);
        let full = ModelTracerConfig::full();
        assert!(full.trace_activations && full.trace_attention && full.trace_logits);
        assert!(full.trace_quant_error && full.trace_kv_cache && full.is_enabled());
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
        // row buffers are recycled, not accumulated
        assert_eq!(tracer.spare_rows.len(), 3);
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
            QuantizationErrorTrace::compute(site, 0, &[1.0], &[1.0], crate::QuantType::Q8_0)
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
                tracer.record_attention_weights(i, 0, pos, &[0.6, 0.3, 0.1]);
                let third = if i == 0 { f32::NAN } else { 0.5 };
                tracer.record_logits(i, &[0.1 * i as f32, 1.0, third, -1.0]);
            }
            tracer.record_quant_error(
                QuantizationErrorTrace::compute(
                    "ffn",
                    2,
                    &[1.0, 2.01],
                    &[1.0, 2.0],
                    crate::QuantType::Q4_K,
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
        assert_eq!(
            (s.total_forwards, s.layers_per_pass, s.anomalies_detected),
            (2, 4, 0)
        );
        assert_eq!(
            (s.attention_traces, s.attention_sinks, s.logit_traces),
            (8, 8, 2)
        );
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
            "Anomalies: 0",
            "Attention traces: 8 (8 attention sinks)",
            "KV peak memory: 2.0 KiB",
            "Avg hit rate: 90.00%",
            "KV thrashing: no",
            "Worst quant cosine: ",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        tracer.clear();
        assert_eq!(tracer.summary(), ModelTracerSummary::default());
        assert!(tracer.summary().to_string().contains("Avg hit rate: n/a"));
    }
}
