//! `gemma3 "The capital of France is"`: greedy continuation of a prompt with Gemma 3 270M,
//! traced by model-trace when built with `--features trace`.

use gemma3::generate::{greedy, load};
use gemma3::weights;
use model_trace::{ModelTracerConfig, Session};
use std::process::ExitCode;

const USAGE: &str = "usage: gemma3 [--max-tokens N] [--logit-lens] [--no-quant] \
                     [--trace-out FILE [--capture PATTERN]] PROMPT\n\
                     built with --features trace, the run is traced: --trace-out writes the trace \
                     file (also MODEL_TRACE_OUT=FILE), --capture saves the tensors it selects in \
                     full beside it (also MODEL_TRACE_CAPTURE); --logit-lens records each layer's \
                     output read through the final norm and head; --no-quant leaves out the quantization error \
                     records (each matmul's f32 twin: the run's slowest part, and 0.7 GB for the \
                     dequantized head)";

struct Args {
    prompt: String,
    max_tokens: usize,
    logit_lens: bool,
    no_quant: bool,
    trace_out: Option<String>,
    capture: Option<String>,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompt: Option<String> = None;
    let mut max_tokens = 8;
    let mut logit_lens = false;
    let mut no_quant = false;
    let (mut trace_out, mut capture) = (None, None);
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
            "--logit-lens" => logit_lens = true,
            "--no-quant" => no_quant = true,
            "--trace-out" => trace_out = Some(value("--trace-out")?),
            "--capture" => capture = Some(value("--capture")?),
            // Test-only (not in the usage): Gemma's porting bugs to inject,
            // `NAME[@LAYER][,...]` (`gemma3::bugs`), for the whole process.
            "--inject-bug" => gemma3::bugs::inject_list(&value("--inject-bug")?)?,
            "-h" | "--help" => return Err(String::new()),
            f if f.starts_with("--") => return Err(format!("unknown flag {f}")),
            _ if prompt.is_some() => return Err("give the prompt as one argument".into()),
            _ => prompt = Some(arg),
        }
    }
    Ok(Args {
        prompt: prompt.ok_or("no prompt given")?,
        max_tokens,
        logit_lens,
        no_quant,
        trace_out,
        capture,
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

fn run(args: &Args) -> gemma3::Result<()> {
    let path = weights::locate_or_fetch()?;
    let (mut model, tokenizer) = load(&path)?;
    model.logit_lens = args.logit_lens;
    let session = if cfg!(feature = "trace") {
        let config = ModelTracerConfig {
            trace_quant_error: !args.no_quant,
            ..ModelTracerConfig::full()
        };
        let mut builder = Session::builder(config)
            .from_env()
            .weights(path.display().to_string())
            .model("Gemma 3 270M (Q4_K_M GGUF)")
            .prompt(args.prompt.clone())
            .dtype("Q4_K, Q5_0, Q6_K and Q8_0 weights, f32 activations")
            .device("cpu");
        if let Some(capture) = &args.capture {
            builder = builder.capture(capture.clone());
        }
        Some(match &args.trace_out {
            Some(file) => builder.trace_file(file).start()?,
            None => builder.start_lenient(),
        })
    } else {
        None
    };
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let generation = greedy(&mut model, &tokenizer, &args.prompt, args.max_tokens);
    if let Some(session) = session {
        let (tracer, errors) = session.finish_with_errors();
        println!("{}", tracer.summary());
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
    }
    let generation = generation?;
    println!("{}{}", args.prompt, generation.text);
    println!("tokens: {:?}", generation.generated);
    if args.logit_lens {
        println!("logit lens (top token per layer, first generated token):");
        for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
            println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
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
    Ok(())
}
