//! Porting bugs that `model-trace diff`'s tests inject, to check that a diff against the
//! PyTorch reference finds each where it was made. Never set in normal use: the CLI's hidden
//! `--inject-bug NAME[@LAYER][,...]` sets them for the whole process.

#[path = "../../shared/bug_switch.rs"]
mod bug_switch;

use bug_switch::BugSwitch;

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Attention scores scaled by `1/d` instead of `1/√d`.
    AttentionScaleOverD,
    /// GELU's tanh approximation instead of the exact (erf) one.
    GeluTanh,
    /// The last layer's output with its tokens in reverse order (statistics unchanged).
    ReversedTokens,
}

impl Bug {
    /// `attention-scale`, `gelu-tanh`, `reversed-tokens`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "attention-scale" => Some(Self::AttentionScaleOverD),
            "gelu-tanh" => Some(Self::GeluTanh),
            "reversed-tokens" => Some(Self::ReversedTokens),
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
