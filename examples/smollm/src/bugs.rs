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
    /// Decode steps (one new token at position > 0) rotated without the pass's offset: the
    /// token's queries and keys at position 0, as if `position` were never added. Shows in the
    /// decode passes only (a prefill, whole or in chunks, is right), from the first decode step.
    RopeDecodePositionMissing,
    /// Decode steps rotated with the pass's offset added twice: the token at `2 · position`
    /// (a padded row's at its position plus the pass's `position` again). Decode passes only.
    RopeDecodePositionTwice,
    /// The KV cache stores keys and values rounded to f16. A pass attends over its own fresh keys
    /// and values at full precision and over the earlier passes' rounded ones, as an f16 cache
    /// does: one prefill pass is exact, the decode steps and the later chunks see the rounding.
    KvCacheF16,
    /// [`Bug::KvCacheF16`] with bf16 (8 bits of mantissa, not 11): a larger rounding.
    KvCacheBf16,
    /// A padded batch rotated without subtracting the padding: row `b`'s column `c` at position
    /// `c`, not `c - padding[b]`. Shows in padded rows only (from their first token on); a
    /// single prompt and a batch of equal lengths are right.
    BatchRopeIgnoresPadding,
    /// A padded batch's mask built from the next row's padding (row `b` from row `(b + 1) % B`'s):
    /// a row attends to padding keys, or loses real ones. Shows in the rows whose padding
    /// differs from the next row's; a single prompt is right.
    BatchMaskOtherRow,
}

impl Bug {
    /// `rope-half-split`, `kv-cache-off-by-one`, `rms-eps`, `rope-base`, `gate-up-swap`,
    /// `rms-sum-halves`, `rope-decode-position-missing`, `rope-decode-position-twice`,
    /// `kv-cache-f16`, `kv-cache-bf16`, `batch-rope-ignores-padding`, `batch-mask-other-row`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "rope-half-split" => Some(Self::RopeHalfSplit),
            "kv-cache-off-by-one" => Some(Self::KvCacheOffByOne),
            "rms-eps" => Some(Self::RmsEpsilon),
            "rope-base" => Some(Self::RopeBase),
            "gate-up-swap" => Some(Self::GateUpSwapped),
            "rms-sum-halves" => Some(Self::RmsSumReassociated),
            "rope-decode-position-missing" => Some(Self::RopeDecodePositionMissing),
            "rope-decode-position-twice" => Some(Self::RopeDecodePositionTwice),
            "kv-cache-f16" => Some(Self::KvCacheF16),
            "kv-cache-bf16" => Some(Self::KvCacheBf16),
            "batch-rope-ignores-padding" => Some(Self::BatchRopeIgnoresPadding),
            "batch-mask-other-row" => Some(Self::BatchMaskOtherRow),
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
