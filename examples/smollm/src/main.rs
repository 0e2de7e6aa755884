//! `smollm "The capital of France is"`: greedy continuation of a prompt with SmolLM2-135M,
//! traced by model-trace when built with `--features trace`.

use model_trace::Session;
use smollm::generate::{greedy, load};
use smollm::report::quant_figures;
use smollm::{weights, TraceLevel};
use std::process::ExitCode;

const USAGE: &str = "usage: smollm [--max-tokens N] [--trace off|lightweight|full-noquant|full] \
                     [--logit-lens] PROMPT\n\
                     --trace defaults to full when built with --features trace, else off";

struct Args {
    prompt: String,
    max_tokens: usize,
    trace: TraceLevel,
    logit_lens: bool,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompt: Option<String> = None;
    let mut max_tokens = 16;
    let mut trace = TraceLevel::DEFAULT;
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
            "--trace" => trace = value("--trace")?.parse()?,
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
    // Empty unless built with `--features trace`.
    for tracepoint in model_trace::tracepoints() {
        println!("{tracepoint}");
    }
    let path = weights::locate_or_fetch()?;
    let (mut model, tokenizer) = load(&path)?;
    model.logit_lens = args.logit_lens;

    let level = args.trace.effective();
    let session = level.config().map(Session::start);
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
            for site in quant_figures(tracer) {
                println!("  {site}");
            }
        }
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
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
