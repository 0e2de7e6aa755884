//! What a session records: [`ModelTracerConfig`], with its parts [`AttentionTraceConfig`] and
//! [`DigestPolicy`]. Record data too: a trace file's header carries it.

mod attention;
mod digest;

use serde::{Deserialize, Serialize};

pub use attention::AttentionTraceConfig;
pub use digest::DigestPolicy;

/// Default [`ModelTracerConfig::memory_limit_bytes`]: 16 MiB, about 200 tokens of SmolLM2-135M
/// traced in full without quantization.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 16 << 20;

/// What a session records (and, for code that records by hand, what a
/// [`ModelTracer`](crate::ModelTracer) keeps). `default()` records nothing.
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
    /// Mixture-of-experts routers: per token the experts chosen, their weights and how close
    /// the choice was, per call each expert's load. On in [`full`](Self::full) and
    /// [`lightweight`](Self::lightweight).
    pub trace_router: bool,
    /// Which tensors get a fingerprint, a sketch and sample values besides their statistics,
    /// when a sink keeps them (the trace file does).
    pub digests: DigestPolicy,
    /// How much the in-memory [`ModelTracer`](crate::ModelTracer) keeps, in bytes of records
    /// (an estimate of their heap size). Past it, new records are counted, not kept; its
    /// summary still covers every record. Default [`DEFAULT_MEMORY_LIMIT_BYTES`].
    pub memory_limit_bytes: usize,
    /// Device tensors (a GPU's) with fewer elements than this are copied whole to the host,
    /// asynchronously, and summarised there; larger ones are reduced on the device by one
    /// kernel. Either way only the end of the forward pass waits for the device. Where a copy
    /// beats the kernel depends on the device; `0` (the default) reduces every tensor on the
    /// device. Tensors that get a digest are always copied (a digest needs every value).
    pub device_copy_below: usize,
    /// Each layer tensor (a stage, a layer's input and output) summarised row by row as well:
    /// the norm, sketch and short fingerprint of every row of its last dimension
    /// ([`RowSummaries`](crate::RowSummaries)), so that two runs that computed the same
    /// positions in other passes (one prefill against prefill and decode steps, chunks against
    /// the whole, a batch against each prompt alone) can be compared position by position
    /// (`model-trace diff`, and the `consistency` module in tests). Needs the values on the host
    /// (a device tensor is copied); about 113 bytes a row in a trace file. Default `false`.
    pub row_summaries: bool,
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
            trace_router: false,
            digests: DigestPolicy::default(),
            memory_limit_bytes: DEFAULT_MEMORY_LIMIT_BYTES,
            device_copy_below: 0,
            row_summaries: false,
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
            trace_router: true,
            ..Self::default()
        }
    }

    /// Activations, KV cache and routers only: the cheap records that catch most failures.
    pub fn lightweight() -> Self {
        Self {
            trace_activations: true,
            trace_kv_cache: true,
            trace_router: true,
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
            || self.trace_router
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
