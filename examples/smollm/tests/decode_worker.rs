//! The benchmark's lockstep worker decodes what the CLI's greedy loop decodes, one step per
//! request. Missing weights fail the test: run `scripts/fetch-models` first.

use smollm::generate::{greedy, load};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const PROMPT: &str = "The capital of France is";
const STEPS: usize = 4;

/// The worker, without the caller's `MODEL_TRACE`, `MODEL_TRACE_OUT` and `MODEL_TRACE_CAPTURE`.
fn worker() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_decode_worker"));
    for var in [
        model_trace::FILTER_ENV_VAR,
        model_trace::OUT_ENV_VAR,
        model_trace::CAPTURE_ENV_VAR,
    ] {
        command.env_remove(var);
    }
    command
}

#[test]
fn worker_steps_follow_the_greedy_continuation() {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) = load(&path).unwrap();
    let expected = greedy(&mut model, &tokenizer, PROMPT, STEPS + 1).unwrap();

    let mut child = worker()
        .args(["--trace", "off", PROMPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("decode_worker starts");
    let mut requests = child.stdin.take().unwrap();
    let mut replies = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(replies.next().unwrap().unwrap(), "ready");
    let mut chosen = Vec::new();
    for _ in 0..STEPS {
        writeln!(requests).unwrap();
        requests.flush().unwrap();
        let reply = replies.next().unwrap().unwrap();
        let (nanos, token) = reply.split_once(' ').expect("`NANOSECONDS TOKEN`");
        assert!(nanos.parse::<u64>().unwrap() > 0, "{reply}");
        chosen.push(token.parse::<u32>().unwrap());
    }
    drop(requests);
    assert!(child.wait().unwrap().success());
    // The prefill chose the first generated token; each step chose one more.
    assert_eq!(chosen, expected.generated[1..=STEPS]);
}

#[test]
fn worker_rejects_an_unknown_trace_level() {
    let output = worker()
        .args(["--trace", "everything", PROMPT])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--trace takes off, lightweight"),
        "{stderr}"
    );
}
