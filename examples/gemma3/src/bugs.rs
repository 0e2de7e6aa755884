//! Gemma 3's known porting bugs, to inject: each is one that a real port shipped or reported
//! (transformers #29402 and #37109, candle #2917 and #3745, mistral.rs #1806, aprender #1606;
//! for the decode, cache and batch paths mlx-lm #1189, sglang #25790, litgpt #2153, tt-xla
//! #5940, unsloth #9708), so that the tests can check what `model-trace diff` names for it. The
//! first eight change every path; the others only the path each names (decode steps, cached
//! chunks, padded batches), so that a comparison of the port with itself finds them. Never set
//! in normal use: the CLI's hidden `--inject-bug NAME[@LAYER][,...]` sets them for the whole
//! process.

#[path = "../../shared/bug_switch.rs"]
mod bug_switch;

use bug_switch::BugSwitch;

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// RMS norms scaled by `1 + w` with the GGUF's weights, which already hold the `+1`
    /// (transformers' loader subtracts it): the offset applied twice.
    NormOffsetTwice,
    /// RMS norms scaled by `w` with transformers' weights (`w - 1` of the GGUF's): the offset
    /// forgotten.
    NormOffsetMissing,
    /// Embeddings not scaled by `√hidden` (applies before the first layer; no `@LAYER`).
    EmbeddingUnscaled,
    /// A sliding-window layer rotated with the global layers' RoPE base (1,000,000, not 10,000).
    RopeBaseGlobal,
    /// The query and key norms skipped.
    QkNormSkipped,
    /// The MLP's GELU in its exact (erf) form instead of the tanh approximation.
    GeluExact,
    /// A layer's RMS norms (input, query/key, post-attention, pre- and post-MLP) with Llama's
    /// epsilon, [`LLAMA_RMS_EPS`] (1e-5), where Gemma 3 uses the GGUF's 1e-6: a kernel or a
    /// config default that ignores the model's value, as aprender's CUDA RMS norm did for
    /// Qwen 2.5's 1e-6 (paiml/aprender #1606: a ~2% drift of the normalised values). `@18`
    /// (one past the last block of 270M) is the final norm.
    RmsEpsilon,
    /// A sliding-window layer whose window lets one key more through (513 for 270M): visible
    /// only past the window, from position 512 on.
    WindowOneTooWide,
    /// In a decode step (one new token after others), a sliding-window layer whose window lets
    /// one key fewer through (511 for 270M): visible only in decode steps from position 511 on;
    /// a prefill, in one pass or in chunks, is unchanged.
    WindowDecodeOneShort,
    /// In a decode step, RoPE without the pass's offset: the new token rotated as if at
    /// position 0. Shows in decode steps from the first one on (`q_norm`/`k_norm` are before
    /// RoPE: the attention is the first stage that moves); a prefill, in one pass or in chunks,
    /// is unchanged.
    RopeDecodePositionMissing,
    /// In a decode step, RoPE with the pass's offset added twice: the token at position `p`
    /// rotated as if at `2p`. Shows like `rope-decode-position-missing`.
    RopeDecodePositionTwice,
    /// The KV cache writes each decode step's keys and values one position early, over the
    /// previous token's, and counts a zero position after them (SmolLM2's `kv-cache-off-by-one`).
    /// Shows in decode steps from the first one on; a prefill, in one pass or in chunks, is
    /// unchanged.
    KvCacheOffByOne,
    /// The KV cache stores keys and values rounded to f16: a pass attends over its own keys and
    /// values at full precision and over the earlier passes' rounded, as a real fp16 cache does.
    /// A one-pass prefill is unchanged; decode steps and later chunks show it.
    KvCacheF16,
    /// `kv-cache-f16` with bf16 (8 bits of significand, not 11: a rounding error 8 times as
    /// large, the same path).
    KvCacheBf16,
    /// In a batch, rotary positions that ignore the left padding: row `b`'s column `c` rotated
    /// at `c`, not `c - pad_b`. Shows in the padded rows only; a single prompt is unchanged.
    BatchRopeIgnoresPadding,
    /// In a batch, row `b`'s mask built from row `(b + 1) % B`'s padding: a row attends to
    /// padding columns or loses real keys. Shows in the rows whose padding differs from the next
    /// row's; a single prompt is unchanged.
    BatchMaskOtherRow,
}

impl Bug {
    /// The names of [`Bug::ALL`], e.g. `norm-offset-twice` or `kv-cache-f16`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, bug)| bug)
    }

    /// Every bug with its name.
    pub const ALL: [(&'static str, Bug); 16] = [
        ("norm-offset-twice", Bug::NormOffsetTwice),
        ("norm-offset-missing", Bug::NormOffsetMissing),
        ("embedding-unscaled", Bug::EmbeddingUnscaled),
        ("rope-base-global", Bug::RopeBaseGlobal),
        ("qk-norm-skipped", Bug::QkNormSkipped),
        ("gelu-exact", Bug::GeluExact),
        ("rms-eps", Bug::RmsEpsilon),
        ("window-one-too-wide", Bug::WindowOneTooWide),
        ("window-decode-one-short", Bug::WindowDecodeOneShort),
        (
            "rope-decode-position-missing",
            Bug::RopeDecodePositionMissing,
        ),
        ("rope-decode-position-twice", Bug::RopeDecodePositionTwice),
        ("kv-cache-off-by-one", Bug::KvCacheOffByOne),
        ("kv-cache-f16", Bug::KvCacheF16),
        ("kv-cache-bf16", Bug::KvCacheBf16),
        ("batch-rope-ignores-padding", Bug::BatchRopeIgnoresPadding),
        ("batch-mask-other-row", Bug::BatchMaskOtherRow),
    ];
}

/// The RMS norm epsilon of [`Bug::RmsEpsilon`]: Llama's, which kernels and configs default to.
pub const LLAMA_RMS_EPS: f32 = 1e-5;

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
