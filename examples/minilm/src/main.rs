//! `minilm [--trace off|lightweight|full] [--trace-out FILE] "some sentence"`: the token ids, the start of the
//! sentence embedding, and for every layer and head which token each token attends to most.
//! Built with `--features trace` it also lists the model's tracepoints at startup, runs the
//! forward pass in a model-trace session and ends with the tracer's summary.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use candle_core::Device;
use clap::Parser;
use minilm::report::{token_labels, StrongestKeys};
use minilm::{tokenizer, weights, Model};
use model_trace::{ModelTracer, ModelTracerConfig, RecordError, Session};

const DEFAULT_SENTENCE: &str = "This is an example sentence";
const SHOWN_DIMS: usize = 8;
/// How much the session records around the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TraceLevel {
    /// No session.
    Off,
    /// Per-layer activation statistics and the anomaly rules.
    Lightweight,
    /// Also every attention row, which is where the attention lines then come from.
    Full,
}

impl TraceLevel {
    /// Everything, where tracing was compiled in: this example is the showcase.
    const DEFAULT: Self = if cfg!(feature = "trace") {
        Self::Full
    } else {
        Self::Off
    };

    fn config(self) -> Option<ModelTracerConfig> {
        match self {
            Self::Off => None,
            Self::Lightweight => Some(ModelTracerConfig::lightweight()),
            Self::Full => Some(ModelTracerConfig::full()),
        }
    }
}

/// The token ids, the start of the sentence embedding, and for every layer and head which token
/// each token attends to most, with all-MiniLM-L6-v2. Built with `--features trace`, it also
/// lists the model's tracepoints, runs the forward pass in a model-trace session and ends with
/// the tracer's summary.
#[derive(Parser)]
#[command(name = "minilm")]
struct Args {
    /// The sentence (its words may be separate arguments).
    #[arg(default_value = DEFAULT_SENTENCE)]
    words: Vec<String>,
    /// What the session records (default: full where tracing is compiled in, else off).
    #[arg(long, value_enum, default_value_t = TraceLevel::DEFAULT)]
    trace: TraceLevel,
    /// Write the trace file here (also `MODEL_TRACE_OUT=FILE`).
    #[arg(long, value_name = "FILE")]
    trace_out: Option<String>,
    /// Save the tensors this filter selects in full beside the trace file (also
    /// `MODEL_TRACE_CAPTURE`).
    #[arg(long, value_name = "PATTERN")]
    capture: Option<String>,
    /// The porting bugs to inject, `NAME[@LAYER][,...]` (`minilm::bugs`), for the whole
    /// process (for the tests).
    #[arg(long, value_name = "BUGS", hide = true)]
    inject_bug: Option<String>,
}

impl Args {
    fn text(&self) -> String {
        self.words.join(" ")
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(bugs) = &args.inject_bug {
        if let Err(message) = minilm::bugs::inject_list(bugs) {
            eprintln!("error: --inject-bug: {message}");
            return ExitCode::from(2);
        }
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    // Empty unless built with `--features trace`.
    let mut report = String::new();
    for tracepoint in model_trace::tracepoints() {
        writeln!(report, "{tracepoint}")?;
    }
    print_report(&report)?;

    let files = weights::locate_or_fetch()?;
    let device = Device::Cpu;
    let model = Model::load(&files, &device)?;
    let tokenizer = tokenizer::load(&files.tokenizer)?;
    let encoded = tokenizer::encode(&tokenizer, &args.text())?;
    let (ids, mask) = encoded.to_tensors(&device)?;

    let level = if cfg!(feature = "trace") || args.trace == TraceLevel::Off {
        args.trace
    } else {
        eprintln!("note: built without `--features trace`; --trace has nothing to record");
        TraceLevel::Off
    };
    let session = match level.config() {
        Some(config) => Some(start_session(config, args, &files, &encoded.ids)?),
        None => None,
    };
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let forward = model.forward_with_attention(&ids, &mask);
    let traced = session.map(Session::finish_with_errors);
    let (hidden, attention) = forward?;
    let embedding = minilm::model::l2_normalize(&minilm::model::mean_pool(&hidden, &mask)?)?;
    let embedding: Vec<f32> = embedding.squeeze(0)?.to_vec1()?;

    let config = model.config();
    let from_tracer = traced.as_ref().and_then(|(tracer, _)| {
        StrongestKeys::from_traces(
            tracer.attention_traces(),
            config.num_hidden_layers,
            config.num_attention_heads,
            encoded.ids.len(),
        )
    });
    let source = if from_tracer.is_some() {
        "the tracer's attention records"
    } else {
        "the captured attention probabilities"
    };
    let strongest = match from_tracer {
        Some(strongest) => strongest,
        None => StrongestKeys::from_probabilities(&attention)?,
    };

    let mut report = String::new();
    writeln!(report, "text: {:?}", args.text())?;
    writeln!(report, "tokens: {}", encoded.tokens.join(" "))?;
    writeln!(report, "ids: {:?}", encoded.ids)?;
    let shown: Vec<String> = embedding
        .iter()
        .take(SHOWN_DIMS)
        .map(|v| format!("{v:.8}"))
        .collect();
    writeln!(
        report,
        "embedding ({} dims, first {}): [{}]",
        embedding.len(),
        shown.len(),
        shown.join(", ")
    )?;
    writeln!(
        report,
        "strongest attention (query->key) per layer and head:"
    )?;
    for line in strongest.lines(&token_labels(&encoded.tokens)) {
        writeln!(report, "{line}")?;
    }
    if let Some((tracer, errors)) = &traced {
        write_trace_report(&mut report, tracer, errors, source)?;
    }
    if let Some(file) = trace_file {
        let bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
        writeln!(
            report,
            "trace file: {} ({:.1} kB; format: docs/trace-format.md)",
            file.display(),
            bytes as f64 / 1e3
        )?;
    }
    print_report(&report)
}

/// The session of a traced run: the environment's settings, the command line's `--trace-out`
/// and `--capture` over them, and what the header should say about the run. A trace file asked
/// for on the command line must be writable; one from the environment is skipped with a note.
fn start_session(
    config: ModelTracerConfig,
    args: &Args,
    files: &weights::ModelFiles,
    token_ids: &[u32],
) -> Result<Session, model_trace::SessionError> {
    let mut builder = Session::builder(config)
        .from_env()
        .model("all-MiniLM-L6-v2")
        .weights(files.weights.display().to_string())
        .prompt(args.text())
        .extra("token_ids", format!("{:?}", token_ids))
        .dtype("f32")
        .device("cpu");
    if let Some(capture) = &args.capture {
        builder = builder.capture(capture.clone());
    }
    // The report below reads the records back from the tracer: keep them in memory also when
    // a trace file holds them (one sentence: a few hundred kB).
    builder = builder.in_memory(true);
    match &args.trace_out {
        Some(path) => builder.trace_file(path).start(),
        None => Ok(builder.start_lenient()),
    }
}

fn write_trace_report(
    report: &mut String,
    tracer: &ModelTracer,
    errors: &[RecordError],
    source: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    writeln!(report, "(attention lines from {source})")?;
    writeln!(report, "{}", tracer.summary().to_string().trim_end())?;
    writeln!(report, "  Layer outputs (recorded statistics):")?;
    for pass in tracer.activation_traces() {
        for layer in &pass.layers {
            let output = &layer.output_stats;
            writeln!(
                report,
                "    layer {}: mean {:+.5} std {:.5} min {:+.4} max {:+.4}",
                layer.layer_idx, output.mean, output.std, output.min, output.max
            )?;
        }
    }
    for error in errors {
        eprintln!("model-trace: not recorded: {error}");
    }
    Ok(())
}

/// Writes at once; a reader that stops early (`| head`) is not an error.
fn print_report(report: &str) -> Result<(), Box<dyn std::error::Error>> {
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}
