//! `gemma3 "The capital of France is"`: greedy continuation of a prompt with Gemma 3 270M,
//! traced by model-trace when built with `--features trace`.

use clap::Parser;
use gemma3::generate::{greedy, load};
use gemma3::weights;
use model_trace::{ModelTracerConfig, Session};
use std::process::ExitCode;

/// Greedy continuation of a prompt with Gemma 3 270M (Q4_K_M GGUF, fetched if missing). Built
/// with `--features trace`, the run is traced.
#[derive(Parser)]
#[command(name = "gemma3")]
struct Args {
    /// The prompt.
    prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 8)]
    max_tokens: usize,
    /// Record each layer's output read through the final norm and head.
    #[arg(long)]
    logit_lens: bool,
    /// Leave out the quantization error records (each matmul's f32 twin: the run's slowest
    /// part, and 0.7 GB for the dequantized head).
    #[arg(long)]
    no_quant: bool,
    /// Write the trace file here (also `MODEL_TRACE_OUT=FILE`).
    #[arg(long, value_name = "FILE")]
    trace_out: Option<String>,
    /// Save the tensors this filter selects in full beside the trace file (also
    /// `MODEL_TRACE_CAPTURE`).
    #[arg(long, value_name = "PATTERN")]
    capture: Option<String>,
    /// Gemma's porting bugs to inject, `NAME[@LAYER][,...]` (`gemma3::bugs`), for the whole
    /// process (for the tests).
    #[arg(long, value_name = "BUGS", hide = true)]
    inject_bug: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(bugs) = &args.inject_bug {
        if let Err(msg) = gemma3::bugs::inject_list(bugs) {
            eprintln!("error: --inject-bug: {msg}");
            return ExitCode::from(2);
        }
    }
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
