//! `smollm "The capital of France is"`: greedy continuation of a prompt with SmolLM2-135M,
//! traced by model-trace when built with `--features trace`.

use model_trace::{ModelTracer, Session, SessionBuilder, TraceReader};
use smollm::generate::{greedy, load};
use smollm::report::quant_figures;
use smollm::{weights, TraceLevel};
use std::process::ExitCode;

const USAGE: &str = "usage: smollm [--max-tokens N] [--ignore-eos] \
                     [--trace off|lightweight|full-noquant|full] [--logit-lens] \
                     [--trace-out FILE [--capture PATTERN]] PROMPT\n\
                     --ignore-eos goes on past the end-of-text token, so exactly N tokens are \
                     generated (for measuring);\n\
                     --trace defaults to full when built with --features trace, else off;\n\
                     --trace-out writes the trace file (also MODEL_TRACE_OUT=FILE), --capture saves \
                     the tensors it selects in full beside it (also MODEL_TRACE_CAPTURE)";

struct Args {
    prompt: String,
    max_tokens: usize,
    ignore_eos: bool,
    trace: TraceLevel,
    logit_lens: bool,
    trace_out: Option<String>,
    capture: Option<String>,
    /// Test-only (not in the usage): a porting bug to inject (`smollm::bugs`).
    inject_bug: Option<smollm::bugs::Bug>,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompt: Option<String> = None;
    let mut max_tokens = 16;
    let mut ignore_eos = false;
    let mut trace = TraceLevel::DEFAULT;
    let mut logit_lens = false;
    let (mut trace_out, mut capture) = (None, None);
    let mut inject_bug = None;
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
            "--ignore-eos" => ignore_eos = true,
            "--trace" => trace = value("--trace")?.parse()?,
            "--logit-lens" => logit_lens = true,
            "--trace-out" => trace_out = Some(value("--trace-out")?),
            "--capture" => capture = Some(value("--capture")?),
            "--inject-bug" => {
                let name = value("--inject-bug")?;
                inject_bug = Some(
                    smollm::bugs::Bug::from_name(&name).ok_or(format!("no bug named {name:?}"))?,
                );
            }
            "-h" | "--help" => return Err(String::new()),
            f if f.starts_with("--") => return Err(format!("unknown flag {f}")),
            _ if prompt.is_some() => return Err("give the prompt as one argument".into()),
            _ => prompt = Some(arg),
        }
    }
    Ok(Args {
        prompt: prompt.ok_or("no prompt given")?,
        max_tokens,
        ignore_eos,
        trace,
        logit_lens,
        trace_out,
        capture,
        inject_bug,
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
    // Empty unless built with `--features trace`.
    for tracepoint in model_trace::tracepoints() {
        println!("{tracepoint}");
    }
    let path = weights::locate_or_fetch()?;
    if let Some(bug) = args.inject_bug {
        smollm::bugs::inject(bug);
    }
    let (mut model, mut tokenizer) = load(&path)?;
    if args.ignore_eos {
        // `greedy` stops at the tokenizer's end-of-text id; no token has this one.
        tokenizer.eos_id = u32::MAX;
    }
    let prompt_ids = smollm::generate::encode_prompt(&tokenizer, &args.prompt)?;
    model.logit_lens = args.logit_lens;

    let level = args.trace.effective();
    let session = match level.config() {
        Some(config) => Some(start_session(
            Session::builder(config)
                .weights(path.display().to_string())
                .extra("prompt_ids", format!("{prompt_ids:?}")),
            args,
        )?),
        None => None,
    };
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let generation = greedy(&mut model, &tokenizer, &args.prompt, args.max_tokens);
    let traced = session.map(Session::finish_with_errors);
    let generation = generation?;
    println!("{}{}", args.prompt, generation.text);

    if args.logit_lens {
        println!("logit lens (top token per layer, first generated token):");
        for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
            println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
        }
    }
    if let Some((tracer, errors)) = &traced {
        println!("{}", tracer.summary());
        if level == TraceLevel::Full {
            println!("quantization error per matmul kind:");
            let replayed = match &trace_file {
                Some(file) if tracer.is_summary_only() => Some(replay(file)?),
                _ => None,
            };
            for site in quant_figures(replayed.as_ref().unwrap_or(tracer)) {
                println!("  {site}");
            }
        }
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
    }
    if let Some(file) = trace_file {
        let bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
        println!(
            "trace file: {} ({:.1} MB; format: docs/trace-format.md)",
            file.display(),
            bytes as f64 / 1e6
        );
    }
    match (generation.median_decode(), generation.fastest_decode()) {
        (Some(median), Some(fastest)) => println!(
            "decode: {:.1} ms/token (median of {} steps, fastest {:.1} ms; prefill of {} tokens {:.1} ms)",
            median.as_secs_f64() * 1e3,
            generation.decode_steps.len(),
            fastest.as_secs_f64() * 1e3,
            generation.prompt_ids.len(),
            generation.prefill.as_secs_f64() * 1e3
        ),
        _ => println!("decode: no decode steps (--max-tokens below 2 or immediate EOS)"),
    }
    Ok(())
}

/// The records of a trace file in a tracer, as the session would have kept them in memory: a
/// session that writes a file keeps only its summary, so that a long run costs no memory.
fn replay(file: &std::path::Path) -> smollm::Result<ModelTracer> {
    let mut reader = TraceReader::open(file)?;
    let mut tracer = ModelTracer::new(reader.header().config.clone());
    for event in &mut reader {
        tracer.accept(&event?);
    }
    Ok(tracer)
}

/// The session of a traced run: the environment's settings, the command line's `--trace-out`
/// and `--capture` over them, and what the header should say about the run. A trace file asked
/// for on the command line must be writable; one from the environment is skipped with a note.
fn start_session(builder: SessionBuilder, args: &Args) -> smollm::Result<Session> {
    let mut builder = builder
        .from_env()
        .model("SmolLM2-135M-Instruct (Q4_1 GGUF)")
        .prompt(args.prompt.clone())
        .dtype("Q4_1 and Q8_0 weights, f32 activations")
        .device("cpu");
    if let Some(capture) = &args.capture {
        builder = builder.capture(capture.clone());
    }
    match &args.trace_out {
        Some(path) => Ok(builder.trace_file(path).start()?),
        None => Ok(builder.start_lenient()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    fn parse(args: &[&str]) -> Result<super::Args, String> {
        parse_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn ignore_eos_is_off_unless_asked_for() {
        let args = parse(&["--max-tokens", "200", "hi"]).unwrap();
        assert_eq!((args.max_tokens, args.ignore_eos), (200, false));
        let args = parse(&["--max-tokens=1000", "--ignore-eos", "hi"]).unwrap();
        assert_eq!((args.max_tokens, args.ignore_eos), (1000, true));
        assert_eq!(args.prompt, "hi");
    }
}
