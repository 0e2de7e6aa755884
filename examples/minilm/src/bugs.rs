//! Porting bugs that `model-trace diff`'s tests inject, to check that a diff against the
//! PyTorch reference finds each where it was made. Never set in normal use: the CLI's hidden
//! `--inject-bug NAME` sets one for the whole process.

use std::sync::atomic::{AtomicU8, Ordering};

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Bug {
    /// Attention scores scaled by `1/d` instead of `1/√d`.
    AttentionScaleOverD = 1,
    /// GELU's tanh approximation instead of the exact (erf) one.
    GeluTanh = 2,
    /// The last layer's output with its tokens in reverse order (statistics unchanged).
    ReversedTokens = 3,
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

static INJECTED: AtomicU8 = AtomicU8::new(0);

/// Injects `bug` for the rest of the process.
pub fn inject(bug: Bug) {
    INJECTED.store(bug as u8, Ordering::Relaxed);
}

/// Whether `bug` was injected.
pub fn injected(bug: Bug) -> bool {
    INJECTED.load(Ordering::Relaxed) == bug as u8
}
