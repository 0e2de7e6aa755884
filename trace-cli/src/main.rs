//! `model-trace`: read trace files written by the model-trace runtime or its Python package.
//!
//! Exit codes: 0 when everything matched (or the command succeeded), 1 when `diff` found a
//! divergence, 2 for bad input (an unreadable or malformed file, bad options).

#![forbid(unsafe_code)]

mod chrome;
mod diff;
mod list;
mod load;
mod output;
mod report;
mod style;
mod summary;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Read model-trace trace files: what one holds, its summary, or where it diverges from a
/// reference.
#[derive(Debug, Parser)]
#[command(name = "model-trace", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Colour: auto (when the output is a terminal and NO_COLOR is unset), always or never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The header, tracepoints, passes and events of a trace.
    List {
        /// The trace file.
        file: PathBuf,
    },
    /// The tracer's summary (anomalies, what the attention heads do, KV cache, quantization)
    /// and a per-layer table of the layers' outputs, times and heads.
    Summary {
        /// The trace file.
        file: PathBuf,
        /// Write the summary as JSON on stdout (header, tracer summary with the attention
        /// analysis, per-layer table).
        #[arg(long)]
        json: bool,
    },
    /// Compare a trace with a reference: the first divergence in execution order, what differs
    /// there and by how much, and the error layer by layer.
    Diff(DiffArgs),
    /// One self-contained HTML page of plots: each stage through the layers, the outputs
    /// through the passes, the attention heads, logit evolution, quantization error, KV cache,
    /// time, and with --against the error against a reference layer by layer.
    Report(ReportArgs),
    /// A timeline in the Chrome trace event format, for Perfetto (ui.perfetto.dev) or
    /// chrome://tracing: passes and layers as nested spans per thread, anomalies as instants.
    Chrome {
        /// Trace files; sessions of one process (one file per thread) share a timeline.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The JSON file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
}

/// Options of `diff`.
#[derive(Debug, Args)]
struct DiffArgs {
    /// The reference trace (for example written by PyTorch through the Python package).
    reference: PathBuf,
    /// The trace compared with it.
    other: PathBuf,
    #[command(flatten)]
    compare: CompareArgs,
    /// The pass whose per-layer table is shown (default: the first divergence's, else the
    /// one with the largest error).
    #[arg(long)]
    pass: Option<usize>,
    /// Write the result as JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `report`.
#[derive(Debug, Args)]
struct ReportArgs {
    /// The trace file.
    file: PathBuf,
    /// A reference trace to compare with (as `diff REF FILE` would).
    #[arg(long, value_name = "REF")]
    against: Option<PathBuf>,
    /// The page to write (default: FILE with the extension .html).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    compare: CompareArgs,
    /// With --against, the pass of the per-layer error curve (default: the first divergence's,
    /// else the one with the largest error).
    #[arg(long)]
    pass: Option<usize>,
}

/// How two traces are compared (`diff`, `report --against`).
#[derive(Debug, Args)]
struct CompareArgs {
    /// Absolute tolerance, `VALUE` or `NAME:VALUE` for the tensors whose full name
    /// (`layer.3.mlp_out`, `layer.30.logits`) matches the glob NAME; repeatable, the last
    /// matching override wins. Default 1e-5.
    #[arg(long, value_name = "[NAME:]VALUE")]
    atol: Vec<String>,
    /// Relative tolerance (times the reference's magnitude), like --atol. Default 1e-5.
    #[arg(long, value_name = "[NAME:]VALUE")]
    rtol: Vec<String>,
    /// Which statistic of the error decides (for captured tensors; summaries are checked
    /// against the bounds it implies).
    #[arg(long, value_enum, default_value_t = StatChoice::Elementwise)]
    check_error_stat: StatChoice,
    /// The quantile for `--check-error-stat quantile`.
    #[arg(long, default_value_t = 0.99)]
    error_quantile: f64,
    /// Rename tensors before matching: a preset (`llama`, `bert`: transformers' module names as
    /// the Python package records them with names="modules" or as converted debugger traces
    /// have them) or a file of `FROM = TO` lines (`{i}` stands for a layer index); repeatable.
    #[arg(long, value_name = "PRESET|FILE")]
    map: Vec<String>,
    /// Compare summaries even where both tensors were captured in full.
    #[arg(long)]
    summaries_only: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatChoice {
    /// Every element within atol + rtol·|a| (the default).
    Elementwise,
    /// The mean of the elements' error over their allowance.
    Mean,
    /// Its median.
    Median,
    /// Its --error-quantile.
    Quantile,
    /// The whole tensor: ‖b − a‖ ≤ √n·atol + rtol·‖a‖ (RMS error against the reference's RMS,
    /// as NMSE checks judge quantized ports).
    Norm,
}

/// What a command found, for the exit code.
enum Outcome {
    Ok,
    Diverged,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let colors = style::Colors::new(match cli.color {
        ColorChoice::Auto => None,
        ColorChoice::Always => Some(true),
        ColorChoice::Never => Some(false),
    });
    let result = match cli.command {
        Command::List { file } => list::run(&file, &colors),
        Command::Summary { file, json } => summary::run(&file, json, &colors),
        Command::Diff(args) => diff::run(&args, &colors),
        Command::Report(args) => report::run(&args),
        Command::Chrome { files, output } => chrome::run(&files, &output),
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Diverged) => ExitCode::from(1),
        Err(error) => {
            eprintln!("model-trace: {error}");
            ExitCode::from(2)
        }
    }
}
