//! One decode step at a time, on request: the process `bench_decode` runs per configuration so
//! that the configurations' steps can take turns (lockstep) instead of whole runs.
//!
//! `decode_worker --trace LEVEL PROMPT` loads SmolLM2, starts a session at `LEVEL`, runs the
//! prompt through the model (the prefill) and prints `ready`. Then each line read from stdin
//! runs one decode step, the greedy choice of the previous step fed back, and prints
//! `NANOSECONDS TOKEN` (the step's wall-clock time and the token it chose). End of input ends
//! the session and the process. Unlike the CLI it does not stop at the end-of-text token: every
//! configuration must run the same number of steps.

use model_trace::Session;
use smollm::generate::{encode_prompt, load};
use smollm::model::argmax;
use smollm::{weights, TraceLevel};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: decode_worker --trace off|lightweight|full-noquant|full PROMPT";

fn main() -> ExitCode {
    let (level, prompt) = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("error: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match serve(level, &prompt) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("decode_worker ({level}): {err}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<(TraceLevel, String), String> {
    let mut level = TraceLevel::DEFAULT;
    let mut prompt = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--trace" => level = args.next().ok_or("--trace needs a value")?.parse()?,
            _ if prompt.is_none() && !arg.starts_with("--") => prompt = Some(arg),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok((level.effective(), prompt.ok_or("no prompt given")?))
}

fn serve(level: TraceLevel, prompt: &str) -> smollm::Result<()> {
    let (mut model, tokenizer) = load(&weights::locate_or_fetch()?)?;
    let prompt_ids = encode_prompt(&tokenizer, prompt)?;
    let _session = level.config().map(Session::start);
    let mut next = argmax(&model.forward(&prompt_ids, 0)?)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for (position, line) in (prompt_ids.len()..).zip(std::io::stdin().lock().lines()) {
        line?;
        let started = Instant::now();
        let logits = model.forward(&[next], position)?;
        let elapsed = started.elapsed();
        next = argmax(&logits)?;
        writeln!(out, "{} {next}", elapsed.as_nanos())?;
        out.flush()?;
    }
    Ok(())
}
