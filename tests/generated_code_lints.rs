//! The code the macros generate must not add a warning to a user's crate, even one that denies
//! `clippy::pedantic`. trybuild does not run clippy, so this test runs `cargo clippy` on
//! `tests/fixtures/lints` (every macro on every supported function shape), with tracing
//! compiled out and compiled in.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn generated_code_passes_pedantic_clippy() {
    let fixture = copy_fixture();
    for features in [&[][..], &["--features", "trace"][..]] {
        let output = Command::new(env!("CARGO"))
            .args(["clippy", "--quiet", "--all-targets"])
            .args(features)
            .args(["--", "-D", "warnings", "-D", "clippy::pedantic"])
            .current_dir(&fixture)
            .env("CARGO_TARGET_DIR", fixture.join("target"))
            .output()
            .expect("cargo runs");
        assert!(
            output.status.success(),
            "clippy {features:?} on the lint fixture failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Copies the fixture into this test's scratch directory under the target directory (wherever
/// `CARGO_TARGET_DIR` puts it), so that its lock file and build stay out of the sources, with
/// the workspace's lock file, so that it builds the dependency versions the workspace tests.
fn copy_fixture() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dest = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lint-fixture");
    let source = root.join("tests/fixtures/lints");
    fs::create_dir_all(dest.join("src")).expect("create fixture dir");
    let manifest = fs::read_to_string(source.join("Cargo.toml")).expect("read fixture manifest");
    let facade = root.display().to_string().replace('\\', "/");
    let manifest = manifest.replace("path = \"../../..\"", &format!("path = \"{facade}\""));
    write_if_changed(&dest.join("Cargo.toml"), &manifest);
    let lib = fs::read_to_string(source.join("src/lib.rs")).expect("read fixture source");
    write_if_changed(&dest.join("src/lib.rs"), &lib);
    // Copied every run, not only the first: a lock file left by an earlier run would keep the
    // fixture on the versions of back then. Cargo prunes the copy to the fixture's packages.
    fs::copy(root.join("Cargo.lock"), dest.join("Cargo.lock")).expect("copy lock file");
    dest
}

/// Leaves unchanged files alone so that cargo's fingerprints keep the second run fast.
fn write_if_changed(path: &Path, contents: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(contents) {
        fs::write(path, contents).expect("write fixture file");
    }
}
