//! The `moe` program as a user runs it, with tracing compiled in or out (this test runs in both
//! builds): four passes printed, a trace file written through `MODEL_TRACE_OUT` only when
//! tracing is compiled in, and clear errors for ids and bugs it cannot run.

mod common;

use common::QWEN3_MOE;
use std::process::{Command, Output};

fn moe(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = QWEN3_MOE.dir();
    Command::new(env!("CARGO_BIN_EXE_moe"))
        .env_remove("MODEL_TRACE_OUT")
        .envs(env.iter().copied())
        .arg("--model")
        .arg(&dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_run_prints_its_passes_and_traces_only_when_compiled_in() {
    let file = std::env::temp_dir().join(format!("moe-runs-{}.ndjson", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let output = moe(&[], &[("MODEL_TRACE_OUT", file.to_str().unwrap())]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("pass 0: position 0, ids [1, 17, 42, 99, 3, 250, 7, 128, 64]"));
    assert!(stdout.contains("pass 3: position 11, ids [33]"), "{stdout}");
    assert_eq!(file.is_file(), cfg!(feature = "trace"));
    let _ = std::fs::remove_file(&file);
}

#[test]
fn ids_and_bugs_it_cannot_run_are_refused_with_a_reason() {
    let outside = moe(&["--tokens", "1,2,256"], &[]);
    assert!(!outside.status.success());
    let stderr = String::from_utf8_lossy(&outside.stderr);
    assert!(
        stderr.contains("token 256 is outside the vocabulary of 256"),
        "{stderr}"
    );
    let too_few = moe(&["--tokens", "1,2", "--decode-steps", "2"], &[]);
    assert!(!too_few.status.success());
    let unknown = moe(&["--inject-bug", "softmax-twice"], &[]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no bug named \"softmax-twice\""));
}
