//! What the command's tests share: scratch directories and running the binary.

use std::path::PathBuf;
use std::process::{Command, Output};

/// An empty directory of this test process, `name` telling the tests apart.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("model-trace-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `model-trace` with `args`, without colour.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_model-trace"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

/// What the command printed, stdout then stderr.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
