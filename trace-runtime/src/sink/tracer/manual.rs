//! The seed's manual API of [`ModelTracer`]: passes and records by hand, for code that records
//! without a session.

use super::ModelTracer;
use crate::analysis::PassRecorder;
use crate::record::{
    AttentionWeightTrace, KvCacheStateTrace, LayerActivationTrace, ModelActivationTrace,
    QuantizationErrorTrace,
};
use crate::stats::TensorStats;

impl ModelTracer {
    /// Starts a forward pass for the token at `position` (ending the open one first, if any).
    pub fn begin_forward(&mut self, position: usize) {
        if self.open.is_some() {
            self.end_forward();
        }
        self.manual
            .get_or_insert_with(PassRecorder::default)
            .begin(position);
        self.open_pass(position);
    }

    /// Whether a forward pass is open.
    pub fn in_forward(&self) -> bool {
        self.open.is_some()
    }

    /// Position of the open forward pass.
    pub fn current_position(&self) -> Option<usize> {
        self.open.map(|open| open.position)
    }

    /// Layers recorded so far in the open pass (when activations are traced).
    pub fn current_activation_trace(&self) -> Option<&ModelActivationTrace> {
        self.activation_traces.get(self.open?.activations?)
    }

    /// Adds one layer's record to the open pass.
    pub fn record_layer_activation(&mut self, trace: LayerActivationTrace) {
        if !self.config.trace_activations || self.open.is_none() {
            return;
        }
        if let Some(manual) = &mut self.manual {
            manual.add_layer(trace.clone());
        }
        self.keep_layer(trace);
    }

    /// Keeps an attention record if attention is traced and its layer and head pass the filters.
    pub fn record_attention(&mut self, trace: AttentionWeightTrace) {
        let filter = &self.config.attention_config;
        if self.config.trace_attention
            && filter.should_trace_layer(trace.layer_idx)
            && filter.should_trace_head(trace.head_idx)
        {
            self.keep_attention(trace);
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
        let row = AttentionWeightTrace::configured(
            &self.config.attention_config,
            layer_idx,
            head_idx,
            query_pos,
            weights,
        );
        if let Some(trace) = row {
            self.keep_attention(trace);
        }
    }

    /// Records one vocabulary row of logits as seen at layer `layer_idx` (for `[seq, vocab]`
    /// logits pass the row of the position being predicted). Call it once per probed layer; the
    /// final layer is the highest index. Ignored outside a pass. A row with NaN, Inf or
    /// exploding values is an anomaly of the pass (stage `logits`), and NaN logits outrank
    /// nothing.
    pub fn record_logits(&mut self, layer_idx: usize, logits: &[f32]) {
        if !self.config.trace_logits || self.open.is_none() {
            return;
        }
        if let Some(manual) = &mut self.manual {
            manual.add_logits_stats(layer_idx, &TensorStats::from_slice(logits));
            manual.add_logit_row(&self.config, layer_idx, 0, logits);
        }
    }

    /// Adds a KV-cache step to the session.
    pub fn record_kv_state(&mut self, trace: KvCacheStateTrace) {
        if self.config.trace_kv_cache {
            self.keep_kv(trace);
        }
    }

    /// Adds a quantization error to the open pass's set, or outside a pass to a set with
    /// `position: None` (consecutive such records share one set).
    pub fn record_quant_error(&mut self, trace: QuantizationErrorTrace) {
        if self.config.trace_quant_error {
            self.keep_quant(trace);
        }
    }

    /// Ends the open pass: runs the anomaly rules over its layers, resolves and finalizes its
    /// logit trace (decisive layer), and files its quantization set. Returns the pass's anomaly
    /// (see [`ModelActivationTrace`] for the rules), or `None` when there is none or no pass is open.
    pub fn end_forward(&mut self) -> Option<String> {
        self.open?;
        let (anomalies, logits) = match &mut self.manual {
            Some(manual) => manual.finish(&self.config),
            None => (Vec::new(), Vec::new()),
        };
        let reported = anomalies.first().map(|a| a.description.clone());
        self.close_pass(anomalies, logits);
        reported
    }
}
