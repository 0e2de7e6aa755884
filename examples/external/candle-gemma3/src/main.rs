//! Writes the runs of the three relations as trace files with row summaries, for
//! `model-trace diff` to line up by position:
//!
//! - `one-pass.ndjson`: the first `--tokens` ids of LICENSE-APACHE in one pass;
//! - `prefill-decode.ndjson`: the same ids as a prefill of `--prefill` and one-token decode steps;
//! - `chunks.ndjson`: the same ids `--chunk` tokens a pass;
//! - `batch-prefill.ndjson` and `alone-prefill-{i}.ndjson`: `--prompts` prompts of
//!   `--prompt-length` tokens in one batch pass, and each alone;
//! - `batch-decode.ndjson` and `alone-decode-{i}.ndjson`: `--prompts` one-token prompts fed
//!   `--batch-steps` tokens, one a step, in one batch, and each alone.
//!
//! - `reference.ndjson` (`--relations reference`): the one pass again, every tensor captured and
//!   no rows, to compare with transformers run on the same ids (`reference.py` beside this
//!   crate writes that trace) by `model-trace diff`.
//!
//! Batch prompts are cut from LICENSE-APACHE's ids one after another. `--dequantize`, or
//! candle's own `CANDLE_DEQUANTIZE_ALL` set in the environment (as candle reads it), runs the
//! model on f32 weights; the trace's header says which, without a line of code here: the
//! session reads the variable candle reads. A run that candle stops with an error is a finding:
//! it is printed, and its trace keeps what ran before it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_gemma3::runs::{Batch, Weights};
use candle_gemma3::{Gemma3, Result};
use clap::{Parser, ValueEnum};
use model_trace::{CandleDequantize, ModelTracerConfig, Session};

/// Writes traces of candle-transformers' quantized Gemma 3 computing the same tokens in
/// different passes, for `model-trace diff`.
#[derive(Parser)]
struct Args {
    /// The directory the traces are written to.
    #[arg(long, default_value = "traces")]
    out: PathBuf,
    /// How many of LICENSE-APACHE's token ids the one-pass, decode and chunk runs compute.
    #[arg(long, default_value_t = 600)]
    tokens: usize,
    /// The prefill before the decode steps.
    #[arg(long, default_value_t = 500)]
    prefill: usize,
    /// Tokens a pass of the chunked run.
    #[arg(long, default_value_t = 128)]
    chunk: usize,
    /// Prompts in a batch.
    #[arg(long, default_value_t = 3)]
    prompts: usize,
    /// Tokens of each prompt of the batch prefill.
    #[arg(long, default_value_t = 520)]
    prompt_length: usize,
    /// Decode steps of the batch of one-token prompts.
    #[arg(long, default_value_t = 16)]
    batch_steps: usize,
    /// Dequantize the weights to f32 at load time (what candle's `CANDLE_DEQUANTIZE_ALL=1` does,
    /// which works as well): the relations at float rounding, without the quantization of the
    /// activations.
    #[arg(long)]
    dequantize: bool,
    /// The relations to write runs for.
    #[arg(long, value_delimiter = ',', default_value = "decode,chunks,batch")]
    relations: Vec<Relation>,
}

/// A relation whose runs are written.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Relation {
    /// One pass, and a prefill with decode steps.
    Decode,
    /// One pass, and chunks.
    Chunks,
    /// A batch, and each prompt alone (a prefill of equal-length prompts; decode steps of
    /// one-token prompts).
    Batch,
    /// The one pass with every tensor captured, for a diff against transformers (not among the
    /// defaults).
    Reference,
}

fn main() -> ExitCode {
    if !cfg!(feature = "trace") {
        eprintln!("candle-gemma3: built without tracing; run it with `--features trace`");
        return ExitCode::from(2);
    }
    match run(&Args::parse()) {
        Ok(commands) => {
            print!("{commands}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("candle-gemma3: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the runs `args` asks for; returns the `model-trace diff` commands that compare them.
fn run(args: &Args) -> Result<String> {
    std::fs::create_dir_all(&args.out)?;
    let weights = if args.dequantize || CandleDequantize::from_env() == CandleDequantize::F32 {
        Weights::Dequantized
    } else {
        Weights::Quantized
    };
    let mut model = Gemma3::load_cached(weights)?;
    let ids = model.license_tokens(args.tokens)?;
    let out = |name: &str| args.out.join(name);
    let mut commands = String::new();
    if args.relations.contains(&Relation::Decode) || args.relations.contains(&Relation::Chunks) {
        write_trace(&out("one-pass.ndjson"), || {
            model.run_split(&ids, ids.len(), ids.len())
        })?;
    }
    for (relation, name, first, step) in [
        (Relation::Decode, "prefill-decode.ndjson", args.prefill, 1),
        (Relation::Chunks, "chunks.ndjson", args.chunk, args.chunk),
    ] {
        if args.relations.contains(&relation) {
            write_trace(&out(name), || model.run_split(&ids, first, step))?;
            let _ = writeln!(
                commands,
                "model-trace diff {} {}",
                out("one-pass.ndjson").display(),
                out(name).display()
            );
        }
    }
    if args.relations.contains(&Relation::Reference) {
        let path = out("reference.ndjson");
        write_captured(&path, || model.run_split(&ids, ids.len(), ids.len()))?;
        let _ = writeln!(
            commands,
            "python reference.py {path} --out {reference}\nmodel-trace diff {reference} {path}",
            path = path.display(),
            reference = out("transformers.ndjson").display()
        );
    }
    if args.relations.contains(&Relation::Batch) {
        for (kind, length, steps) in [
            ("prefill", args.prompt_length, 0),
            ("decode", 1, args.batch_steps),
        ] {
            let batch = model.license_batch(args.prompts, length, steps)?;
            let command = write_batch(&mut model, &batch, &args.out, kind)?;
            commands.push_str(&command);
        }
    }
    Ok(commands)
}

/// Writes `batch` run together and each row alone (`batch-{kind}.ndjson`,
/// `alone-{kind}-{i}.ndjson`); returns the command that compares them.
fn write_batch(model: &mut Gemma3, batch: &Batch, dir: &Path, kind: &str) -> Result<String> {
    let mut command = String::from("model-trace diff");
    for row in 0..batch.prompts().len() {
        let path = dir.join(format!("alone-{kind}-{row}.ndjson"));
        write_trace(&path, || model.run_alone(batch, row))?;
        let _ = write!(command, " {}", path.display());
    }
    let path = dir.join(format!("batch-{kind}.ndjson"));
    write_trace(&path, || model.run_batch(batch))?;
    let _ = writeln!(command, " --batch {}", path.display());
    Ok(command)
}

/// Records `run` into a trace file at `path`, every layer tensor's rows summarised. An error of
/// the run is reported, not returned: the trace holds what ran before it.
fn write_trace<T>(path: &Path, run: impl FnOnce() -> Result<T>) -> Result<()> {
    let config = ModelTracerConfig {
        trace_activations: true,
        row_summaries: true,
        ..ModelTracerConfig::default()
    };
    record(Session::builder(config).trace_file(path), path, run)
}

/// Records `run` into a trace file at `path`, every layer tensor captured.
fn write_captured<T>(path: &Path, run: impl FnOnce() -> Result<T>) -> Result<()> {
    let config = ModelTracerConfig {
        trace_activations: true,
        ..ModelTracerConfig::default()
    };
    let builder = Session::builder(config).trace_file(path).capture("*");
    record(builder, path, run)
}

/// Starts `builder`'s session, runs `run` in it and says what was written.
fn record<T>(
    builder: model_trace::SessionBuilder,
    path: &Path,
    run: impl FnOnce() -> Result<T>,
) -> Result<()> {
    let session = builder.start()?;
    let outcome = run();
    session.finish();
    let bytes = std::fs::metadata(path)?.len();
    match outcome {
        Ok(_) => eprintln!("wrote {} ({bytes} bytes)", path.display()),
        Err(error) => eprintln!(
            "wrote {} ({bytes} bytes); the run stopped: {error}",
            path.display()
        ),
    }
    Ok(())
}
