//! `moe --model DIR`: a mixture-of-experts model of transformers' `save_pretrained` (Qwen3-MoE or
//! DeepSeek-V3, by `config.json`'s `model_type`) run over token ids: a prefill, then a few
//! decode steps through the KV cache, traced by model-trace when built with `--features trace`.

use clap::Parser;
use model_trace::{ModelTracerConfig, Session};
use moe::passes::{self, Pass};
use moe::Model;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The ids run when none are given: 12 ids below 256 (the test models' vocabulary).
const DEFAULT_TOKENS: &str = "1,17,42,99,3,250,7,128,64,5,200,33";

/// Runs a Qwen3-MoE or DeepSeek-V3 model (config.json + model.safetensors, F32) over token ids:
/// one prefill pass, then one decode step a token for the last `--decode-steps` ids. Built with
/// `--features trace`, the run is traced.
#[derive(Parser)]
#[command(name = "moe")]
struct Args {
    /// The model's directory: config.json and model.safetensors, as transformers'
    /// save_pretrained writes them.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// The token ids, comma-separated.
    #[arg(long, value_name = "IDS", default_value = DEFAULT_TOKENS, value_parser = token_ids)]
    tokens: TokenIds,
    /// How many of the last ids run one a pass after the prefill of the others.
    #[arg(long, value_name = "N", default_value_t = 3)]
    decode_steps: usize,
    /// Write the trace file here (also `MODEL_TRACE_OUT=FILE`).
    #[arg(long, value_name = "FILE")]
    trace_out: Option<String>,
    /// Save the tensors this filter selects in full beside the trace file (also
    /// `MODEL_TRACE_CAPTURE`).
    #[arg(long, value_name = "PATTERN")]
    capture: Option<String>,
    /// Routing bugs to inject, `NAME[@LAYER][,...]` (`moe::bugs`), for the whole process (for
    /// the tests).
    #[arg(long, visible_alias = "bug", value_name = "BUGS", hide = true)]
    inject_bug: Option<String>,
}

/// Comma-separated token ids.
#[derive(Clone)]
struct TokenIds(Vec<u32>);

fn token_ids(text: &str) -> Result<TokenIds, String> {
    text.split(',')
        .map(|id| {
            let id = id.trim();
            id.parse::<u32>()
                .map_err(|_| format!("`{id}` is not a token id (a whole number)"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(TokenIds)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(bugs) = &args.inject_bug {
        if let Err(msg) = moe::bugs::inject_list(bugs) {
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

fn run(args: &Args) -> moe::Result<()> {
    let mut model = Model::load(&args.model)?;
    let ids = &args.tokens.0;
    model.check_tokens(ids, 0)?;
    passes::split(ids, args.decode_steps)?;
    let session = start_session(args, &model)?;
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(Path::to_path_buf));
    let outcome = passes::run(&mut model, ids, args.decode_steps);
    if let Some(session) = session {
        let (tracer, errors) = session.finish_with_errors();
        println!("{}", tracer.summary());
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
    }
    print_passes(&outcome?);
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

/// The tracing session of the run, with tracing compiled in.
fn start_session(args: &Args, model: &Model) -> moe::Result<Option<Session>> {
    if !cfg!(feature = "trace") {
        return Ok(None);
    }
    let config = model.config();
    let moe_layers = model.blocks().iter().filter(|b| b.is_moe()).count();
    let description = format!(
        "{} ({} layers, {} of them {} experts top-{}; config.json + model.safetensors)",
        config.family.model_type(),
        config.num_layers,
        moe_layers,
        config.moe.num_experts,
        config.moe.router.top_k,
    );
    let ids: Vec<String> = args.tokens.0.iter().map(u32::to_string).collect();
    let mut builder = Session::builder(ModelTracerConfig::full())
        .from_env()
        .weights(args.model.display().to_string())
        .model(description)
        .prompt(format!("token ids {}", ids.join(",")))
        .dtype("F32 weights; F32 activations; F32 KV cache")
        .precision(model.precision())
        .device("cpu");
    if let Some(capture) = &args.capture {
        builder = builder.capture(capture.clone());
    }
    Ok(Some(match &args.trace_out {
        Some(file) => builder.trace_file(file).start()?,
        None => builder.start_lenient(),
    }))
}

/// Each pass's position, ids and most likely next token.
fn print_passes(passes: &[Pass]) {
    for (i, pass) in passes.iter().enumerate() {
        println!(
            "pass {i}: position {}, ids {:?}, next {}",
            pass.position, pass.ids, pass.next
        );
    }
}
