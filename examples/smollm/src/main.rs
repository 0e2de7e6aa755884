//! `smollm "The capital of France is"`: greedy continuation of a prompt with SmolLM2-135M.

use smollm::generate::{greedy, load};
use smollm::weights;
use std::process::ExitCode;

const USAGE: &str =
    "usage: smollm [--max-tokens N] [--trace off|lightweight|full] [--logit-lens] PROMPT";

/// How much model-trace records; parsed now, wired to a session once the runtime lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TraceLevel {
    Off,
    Lightweight,
    Full,
}

struct Args {
    prompt: String,
    max_tokens: usize,
    trace: TraceLevel,
    logit_lens: bool,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompt: Option<String> = None;
    let mut max_tokens = 16;
    let mut trace = TraceLevel::Off;
    let mut logit_lens = false;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--max-tokens" => {
                let v = value("--max-tokens")?;
                max_tokens = v
                    .parse()
                    .map_err(|_| format!("--max-tokens takes a number, not {v:?}"))?;
            }
            "--trace" => {
                trace = match value("--trace")?.as_str() {
                    "off" => TraceLevel::Off,
                    "lightweight" => TraceLevel::Lightweight,
                    "full" => TraceLevel::Full,
                    other => {
                        return Err(format!(
                            "--trace takes off, lightweight or full, not {other:?}"
                        ))
                    }
                };
            }
            "--logit-lens" => logit_lens = true,
            "-h" | "--help" => return Err(String::new()),
            f if f.starts_with("--") => return Err(format!("unknown flag {f}")),
            _ if prompt.is_some() => return Err("give the prompt as one argument".into()),
            _ => prompt = Some(arg),
        }
    }
    Ok(Args {
        prompt: prompt.ok_or("no prompt given")?,
        max_tokens,
        trace,
        logit_lens,
    })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> smollm::Result<()> {
    let path = weights::locate_or_fetch()?;
    let (mut model, tokenizer) = load(&path)?;
    model.logit_lens = args.logit_lens;
    // Phase 2 starts a model-trace session at this level.
    let _trace = args.trace;

    let generation = greedy(&mut model, &tokenizer, &args.prompt, args.max_tokens)?;
    println!("{}{}", args.prompt, generation.text);

    if args.logit_lens {
        println!("logit lens (top token per layer, first generated token):");
        for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
            println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
        }
    }
    match generation.median_decode() {
        Some(median) => println!(
            "decode: {:.1} ms/token (median of {} steps; prefill of {} tokens {:.1} ms)",
            median.as_secs_f64() * 1e3,
            generation.decode_steps.len(),
            generation.prompt_ids.len(),
            generation.prefill.as_secs_f64() * 1e3
        ),
        None => println!("decode: no decode steps (--max-tokens below 2 or immediate EOS)"),
    }
    Ok(())
}
