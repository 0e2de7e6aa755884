//! Which attention rows a session records: [`AttentionTraceConfig`].

use serde::{Deserialize, Serialize};

/// Which rows to record and how much of each to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AttentionTraceConfig {
    /// Keys kept per query row.
    pub top_k: usize,
    /// Layers to trace; `None` traces all.
    pub layers: Option<Vec<usize>>,
    /// Heads to trace (in every traced layer); `None` traces all.
    pub heads: Option<Vec<usize>>,
    /// Weights below this are not kept in the top-k (they still count in tail mass and entropy),
    /// so a diffuse row costs no storage.
    pub weight_threshold: f32,
}

impl Default for AttentionTraceConfig {
    /// Top 10 keys per row, weights of at least 1%, every layer and head.
    fn default() -> Self {
        Self {
            top_k: 10,
            layers: None,
            heads: None,
            weight_threshold: 0.01,
        }
    }
}

impl AttentionTraceConfig {
    /// Whether rows of layer `layer_idx` are recorded.
    pub fn should_trace_layer(&self, layer_idx: usize) -> bool {
        self.layers.as_ref().is_none_or(|l| l.contains(&layer_idx))
    }

    /// Whether rows of head `head_idx` are recorded.
    pub fn should_trace_head(&self, head_idx: usize) -> bool {
        self.heads.as_ref().is_none_or(|h| h.contains(&head_idx))
    }
}
