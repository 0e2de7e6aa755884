//! Gemma 3's known porting bugs, to inject: each is one that a real port shipped or reported
//! (transformers #29402 and #37109, candle #2917 and #3745, mistral.rs #1806), so that the tests
//! can check what `model-trace diff` names for it. Never set in normal use: the CLI's hidden
//! `--inject-bug NAME[@LAYER][,...]` sets them for the whole process.

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
    /// A sliding-window layer whose window lets one key more through (513 for 270M): visible
    /// only past the window, from position 512 on.
    WindowOneTooWide,
}

impl Bug {
    /// `norm-offset-twice`, `norm-offset-missing`, `embedding-unscaled`, `rope-base-global`,
    /// `qk-norm-skipped`, `gelu-exact`, `window-one-too-wide`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, bug)| bug)
    }

    /// Every bug with its name.
    pub const ALL: [(&'static str, Bug); 7] = [
        ("norm-offset-twice", Bug::NormOffsetTwice),
        ("norm-offset-missing", Bug::NormOffsetMissing),
        ("embedding-unscaled", Bug::EmbeddingUnscaled),
        ("rope-base-global", Bug::RopeBaseGlobal),
        ("qk-norm-skipped", Bug::QkNormSkipped),
        ("gelu-exact", Bug::GeluExact),
        ("window-one-too-wide", Bug::WindowOneTooWide),
    ];
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
