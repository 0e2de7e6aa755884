//! Porting bugs that `model-trace diff`'s tests inject, to check that a diff against the
//! PyTorch reference finds each where it was made, and that isolation names the layer it was
//! made in. Never set in normal use: the CLI's hidden `--inject-bug NAME[@LAYER][,...]` sets
//! them for the whole process.

#[path = "../../shared/bug_switch.rs"]
mod bug_switch;

use bug_switch::BugSwitch;

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Rotary embeddings with the half-split pair layout (`rope`) instead of the interleaved one
    /// this GGUF's permuted Q/K weights need (`rope_i`).
    RopeHalfSplit,
    /// The KV cache writes each decode step's keys and values one position early, over the
    /// previous token's (the prefill is right).
    KvCacheOffByOne,
    /// Both RMS norms of a block with the epsilon read from the neighbouring GGUF key
    /// (`llama.attention.head_count_kv`: 3 for SmolLM2-135M) instead of
    /// `llama.attention.layer_norm_rms_epsilon` (1e-5).
    RmsEpsilon,
    /// Rotary tables of base 10,000 (Llama's default) instead of the model's 100,000.
    RopeBase,
    /// The MLP's gate and up projections swapped: `silu(up(x)) * gate(x)`.
    GateUpSwapped,
    /// Both RMS norms of a block with their sum of squares taken as two half sums added: a
    /// reassociated sum, the same value rounded differently. Not a bug of the result (its
    /// error is a rounding's), the smallest change a refactor makes: what a golden check must
    /// still name.
    RmsSumReassociated,
}

impl Bug {
    /// `rope-half-split`, `kv-cache-off-by-one`, `rms-eps`, `rope-base`, `gate-up-swap`,
    /// `rms-sum-halves`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "rope-half-split" => Some(Self::RopeHalfSplit),
            "kv-cache-off-by-one" => Some(Self::KvCacheOffByOne),
            "rms-eps" => Some(Self::RmsEpsilon),
            "rope-base" => Some(Self::RopeBase),
            "gate-up-swap" => Some(Self::GateUpSwapped),
            "rms-sum-halves" => Some(Self::RmsSumReassociated),
            _ => None,
        }
    }
}

static INJECTED: BugSwitch<Bug> = BugSwitch::new();

/// Injects the bugs of `NAME[@LAYER][,NAME[@LAYER]...]` for the rest of the process (`NAME`
/// alone: in every layer).
pub fn inject_list(text: &str) -> Result<(), String> {
    INJECTED.inject_list(text, Bug::from_name)
}

/// Whether `bug` was injected, in any layer.
pub fn injected(bug: Bug) -> bool {
    INJECTED.injected(bug)
}

/// Whether `bug` was injected in `layer` (or in every layer).
pub fn injected_at(bug: Bug, layer: usize) -> bool {
    INJECTED.injected_at(bug, layer)
}
