//! `gemma3 "The capital of France is"`: greedy continuation of a prompt with Gemma 3 270M,
//! traced by model-trace when built with `--features trace`. The prompt can also run in other
//! passes (`--decode-from`, `--prefill-chunk`), and several prompts as one batch.

use clap::Parser;
use gemma3::generate::{greedy_ids, load, Generation};
use gemma3::passes::{greedy_batch, Split};
use gemma3::quant_linear::dtype_text;
use gemma3::{weights, GgufTokenizer, Model};
use model_trace::{ModelTracerConfig, Precision, Session};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Greedy continuation of a prompt with Gemma 3 270M (Q4_K_M GGUF, fetched if missing). Built
/// with `--features trace`, the run is traced.
#[derive(Parser)]
#[command(name = "gemma3")]
struct Args {
    /// The prompt; several make a batch (left-padded to the longest, decoded together), and
    /// each row's text is printed.
    #[arg(value_name = "PROMPT", required_unless_present = "prompt_file")]
    prompts: Vec<String>,
    /// Read the prompt from this file instead.
    #[arg(long, value_name = "PATH", conflicts_with = "prompts")]
    prompt_file: Option<PathBuf>,
    /// Cut each prompt's ids (`<bos>` included) to the first N.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    max_prompt_tokens: Option<usize>,
    /// Prefill the first K prompt tokens in one pass, then feed the rest one token a pass (one
    /// prompt only).
    #[arg(long, value_name = "K", value_parser = at_least_one, conflicts_with = "prefill_chunk")]
    decode_from: Option<usize>,
    /// Prefill the prompt in passes of C tokens, each through the KV cache (one prompt only).
    #[arg(long, value_name = "C", value_parser = at_least_one)]
    prefill_chunk: Option<usize>,
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
    /// Summarise every layer tensor row by row too (each position's norm, sketch and
    /// fingerprint, about 113 bytes a row), so that `model-trace diff` can compare this run
    /// with another that split the same tokens into other passes, position by position.
    #[arg(long)]
    rows: bool,
    /// Run every matmul on its dequantized f32 weight: no 8-bit rounding of the activations,
    /// so a comparison by position has f32 rounding as its floor (what candle's
    /// `CANDLE_DEQUANTIZE_ALL=1` does too). The trace header says so in its precision.
    #[arg(long)]
    dequantize: bool,
    /// Gemma's porting bugs to inject, `NAME[@LAYER][,...]` (`gemma3::bugs`), for the whole
    /// process (for the tests).
    #[arg(long, value_name = "BUGS", hide = true)]
    inject_bug: Option<String>,
}

/// A count of tokens that must be at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of at least 1")),
    }
}

impl Args {
    /// The passes the prompt runs in.
    fn split(&self) -> Split {
        match (self.decode_from, self.prefill_chunk) {
            (Some(prefill), _) => Split::DecodeFrom(prefill),
            (None, Some(chunk)) => Split::Chunks(chunk),
            (None, None) => Split::Whole,
        }
    }

    /// The prompts' texts: the arguments, or the file's.
    fn prompt_texts(&self) -> Result<Vec<String>, String> {
        match &self.prompt_file {
            Some(path) => std::fs::read_to_string(path)
                .map(|text| vec![text])
                .map_err(|e| format!("--prompt-file {}: {e}", path.display())),
            None => Ok(self.prompts.clone()),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(bugs) = &args.inject_bug {
        if let Err(msg) = gemma3::bugs::inject_list(bugs) {
            eprintln!("error: --inject-bug: {msg}");
            return ExitCode::from(2);
        }
    }
    let texts = match args.prompt_texts() {
        Ok(texts) if texts.len() > 1 && args.split() != Split::Whole => {
            eprintln!("error: --decode-from and --prefill-chunk run one prompt, not a batch");
            return ExitCode::from(2);
        }
        Ok(texts) => texts,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args, &texts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One prompt's ids (cut to `--max-prompt-tokens`) and the text they stand for.
struct Prompt {
    ids: Vec<u32>,
    text: String,
}

impl Prompt {
    fn encode(tokenizer: &GgufTokenizer, text: &str, max: Option<usize>) -> gemma3::Result<Self> {
        let mut ids = tokenizer.encode(text)?;
        if ids.is_empty() {
            return Err(gemma3::Error::Tokenizer(
                "the prompt encodes to no tokens".into(),
            ));
        }
        let max = max.unwrap_or(usize::MAX);
        if ids.len() <= max {
            return Ok(Self {
                ids,
                text: text.to_string(),
            });
        }
        ids.truncate(max);
        let text = tokenizer.decode(&ids)?;
        Ok(Self { ids, text })
    }
}

fn run(args: &Args, texts: &[String]) -> gemma3::Result<()> {
    let path = weights::locate_or_fetch()?;
    let (mut model, tokenizer) = load(&path)?;
    if args.dequantize {
        model.dequantize_matmuls()?;
    }
    model.logit_lens = args.logit_lens;
    let prompts = texts
        .iter()
        .map(|text| Prompt::encode(&tokenizer, text, args.max_prompt_tokens))
        .collect::<gemma3::Result<Vec<_>>>()?;
    let session = start_session(args, &path, &prompts, model.precision())?;
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let outcome = match prompts.as_slice() {
        [prompt] => greedy_ids(
            &mut model,
            &tokenizer,
            prompt.ids.clone(),
            args.split(),
            args.max_tokens,
        )
        .map(|generation| vec![generation]),
        _ => batch(&mut model, &tokenizer, &prompts, args.max_tokens),
    };
    if let Some(session) = session {
        let (tracer, errors) = session.finish_with_errors();
        println!("{}", tracer.summary());
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
    }
    match outcome?.as_slice() {
        [generation] => print_one(args, &tokenizer, &prompts[0], generation)?,
        rows => print_rows(&prompts, rows),
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

/// The tracing session of the run, with tracing compiled in.
fn start_session(
    args: &Args,
    weights: &Path,
    prompts: &[Prompt],
    precision: Precision,
) -> gemma3::Result<Option<Session>> {
    if !cfg!(feature = "trace") {
        return Ok(None);
    }
    let config = ModelTracerConfig {
        trace_quant_error: !args.no_quant,
        row_summaries: args.rows,
        ..ModelTracerConfig::full()
    };
    let prompt = match prompts {
        [prompt] => prompt.text.clone(),
        _ => format!("{:?}", prompts.iter().map(|p| &p.text).collect::<Vec<_>>()),
    };
    let mut builder = Session::builder(config)
        .from_env()
        .weights(weights.display().to_string())
        .model("Gemma 3 270M (Q4_K_M GGUF)")
        .prompt(prompt)
        .dtype(dtype_text(&precision))
        .precision(precision)
        .device("cpu");
    if let Some(capture) = &args.capture {
        builder = builder.capture(capture.clone());
    }
    Ok(Some(match &args.trace_out {
        Some(file) => builder.trace_file(file).start()?,
        None => builder.start_lenient(),
    }))
}

/// The prompts decoded together as one batch, each row's result as a [`Generation`] (without a
/// logit lens).
fn batch(
    model: &mut Model,
    tokenizer: &GgufTokenizer,
    prompts: &[Prompt],
    steps: usize,
) -> gemma3::Result<Vec<Generation>> {
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let rows = greedy_batch(model, tokenizer, &ids, steps)?;
    ids.into_iter()
        .zip(rows)
        .map(|(prompt_ids, generated)| {
            Ok(Generation {
                text: tokenizer.decode(&generated)?,
                stopped: generated
                    .last()
                    .is_some_and(|id| tokenizer.stop_ids.contains(id)),
                prompt_ids,
                generated,
                prefill_lens_top: Vec::new(),
            })
        })
        .collect()
}

/// A single prompt's continuation, its ids and, with `--logit-lens`, each layer's top token.
fn print_one(
    args: &Args,
    tokenizer: &GgufTokenizer,
    prompt: &Prompt,
    generation: &Generation,
) -> gemma3::Result<()> {
    println!("{}{}", prompt.text, generation.text);
    println!("tokens: {:?}", generation.generated);
    if args.logit_lens {
        println!("logit lens (top token per layer, first generated token):");
        for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
            println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
        }
    }
    Ok(())
}

/// Each row of a batch: its prompt and continuation, then its ids.
fn print_rows(prompts: &[Prompt], rows: &[Generation]) {
    for (row, (prompt, generation)) in prompts.iter().zip(rows).enumerate() {
        println!("row {row}: {}{}", prompt.text, generation.text);
        println!("row {row} tokens: {:?}", generation.generated);
    }
}
