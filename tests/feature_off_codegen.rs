//! With tracing compiled out, annotations must leave no trace in the binary: a crate with them
//! and the same crate with them blanked (same line numbers) compile to the same `.text`.
//!
//! Both builds happen at the same path with the same package name, so symbol hashes and
//! metadata agree and only the source differs. The crate lives in this test's scratch directory
//! (under the target directory, wherever `CARGO_TARGET_DIR` puts it) and resolves its
//! dependencies from a copy of the workspace's `Cargo.lock`, so it builds the versions the
//! workspace tests rather than whatever is newest. Compiled in, the test is moot and skipped.
#![cfg(not(feature = "enabled"))]

use std::path::{Path, PathBuf};
use std::process::Command;

const FIXTURE: &str = include_str!("fixtures/codegen_off/main.rs");
/// A burn model's shapes (tensors by value, `tokens = &ids`), on burn-tensor without a backend.
const BURN_FIXTURE: &str = include_str!("fixtures/codegen_off/burn.rs");

/// The source without its annotations, line for line: an attribute or an inline macro's line
/// becomes empty, and `let h = model_trace::trace_stage!("s", h);`, whose value the program
/// goes on with, becomes `let h = h;`.
fn blank_annotations(source: &str) -> String {
    source
        .lines()
        .map(|line| {
            let code = line.trim_start();
            if let Some(stage) = blank_stage(line) {
                return stage;
            }
            let annotation =
                code.starts_with("#[trace_") || code.starts_with("model_trace::trace_");
            if annotation {
                String::new()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `let NAME = model_trace::trace_stage!("s", VALUE);` as `let NAME = VALUE;`.
fn blank_stage(line: &str) -> Option<String> {
    let (binding, call) = line.split_once("= model_trace::trace_stage!(")?;
    let value = call.strip_suffix(");")?.split_once(", ")?.1;
    Some(format!("{binding}= {value};"))
}

/// `dependencies`: the lines after model-trace's in `[dependencies]`.
///
/// One codegen unit: with several, the functions that units share get names carrying a hash of
/// their unit (`do_reserve_and_handle...llvm.940020126153301898`), which changes with the source
/// even where the code does not. In a fresh run under another `CARGO_HOME`, the annotated and the
/// blanked binaries' global offset tables came out in another order, and with them the
/// RIP-relative offsets in `.text` (the same size, other bytes); with one unit the two `.text`
/// sections were identical.
fn manifest(facade: &Path, features: &str, dependencies: &str) -> String {
    format!(
        "[package]\nname = \"codegen-off\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\nmodel-trace = {{ path = {facade:?}, features = [{features}] }}\n{dependencies}\n\
         [profile.release]\ncodegen-units = 1\n\n\
         [workspace]\n"
    )
}

/// Builds the crate at `dir` in release mode and returns the bytes of its `.text` section.
fn text_section(dir: &Path, source: &str) -> Vec<u8> {
    std::fs::write(dir.join("src/main.rs"), source).expect("write fixture source");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(status.success(), "fixture crate failed to build");
    let binary = std::fs::read(dir.join("target/release/codegen-off")).expect("read binary");
    let file = object::File::parse(&*binary).expect("parse binary");
    use object::{Object, ObjectSection};
    let text = file.section_by_name(".text").expect("binary has .text");
    text.data().expect(".text data").to_vec()
}

/// Builds `source` in a crate of its own under `name`, annotated and blanked, and compares.
fn assert_annotations_compile_to_nothing(name: &str, source: &str, manifest: &str) {
    let facade = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(dir.join("src")).expect("create fixture crate");
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("write manifest");
    // Copied every run: cargo prunes the copy to this crate's packages, keeping their versions.
    std::fs::copy(facade.join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy lock file");

    let blanked = blank_annotations(source);
    assert_eq!(blanked.lines().count(), source.lines().count());
    assert_ne!(blanked, source, "the fixture has annotations to blank");

    let annotated_text = text_section(&dir, source);
    let blanked_text = text_section(&dir, &blanked);
    assert!(!annotated_text.is_empty());
    assert!(
        annotated_text == blanked_text,
        "{name}: .text differs: {} bytes annotated, {} bytes blanked",
        annotated_text.len(),
        blanked_text.len()
    );
}

#[test]
fn annotations_compile_to_nothing_when_tracing_is_off() {
    let facade = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    assert!(
        blank_annotations(FIXTURE).contains("let probs = probs;"),
        "the returned stage is blanked to its value"
    );
    assert_annotations_compile_to_nothing("codegen-off", FIXTURE, &manifest(&facade, "", ""));
}

/// The same for burn code, with the `burn` feature: burn-tensor in the version of the
/// workspace's lock file, without a backend (the fixture is built, not run).
#[test]
fn burn_annotations_compile_to_nothing_when_tracing_is_off() {
    let facade = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let burn =
        "burn-tensor = { version = \"0.22.1\", default-features = false, features = [\"std\"] }";
    let manifest = manifest(&facade, "\"burn\"", burn);
    assert_annotations_compile_to_nothing("codegen-off-burn", BURN_FIXTURE, &manifest);
}
