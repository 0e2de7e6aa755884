//! Porting bugs that `model-trace diff`'s tests inject, to check that a diff against the
//! PyTorch reference finds each where it was made. Never set in normal use: the CLI's hidden
//! `--inject-bug NAME` sets one for the whole process.

use std::sync::atomic::{AtomicU8, Ordering};

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Bug {
    /// Rotary embeddings with the half-split pair layout (`rope`) instead of the interleaved one
    /// this GGUF's permuted Q/K weights need (`rope_i`).
    RopeHalfSplit = 1,
    /// The KV cache writes each decode step's keys and values one position early, over the
    /// previous token's (the prefill is right).
    KvCacheOffByOne = 2,
}

impl Bug {
    /// `rope-half-split`, `kv-cache-off-by-one`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "rope-half-split" => Some(Self::RopeHalfSplit),
            "kv-cache-off-by-one" => Some(Self::KvCacheOffByOne),
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
