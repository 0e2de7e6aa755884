//! `minilm-burn [--device ndarray|flex] [--trace off|lightweight|full] [--trace-out FILE] "some
//! sentence"`: the sentence embedding of all-MiniLM-L6-v2 run by burn. Built with
//! `--features trace` it also lists the model's tracepoints, runs the forward pass in a
//! model-trace session and ends with the tracer's summary.

use std::process::ExitCode;

use clap::Parser;
use minilm::{tokenizer, weights};
use minilm_burn::{model, Backend, Model};
use model_trace::{ModelTracerConfig, Session};

const DEFAULT_SENTENCE: &str = "This is an example sentence";
const SHOWN_DIMS: usize = 8;

/// How much the session records around the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TraceLevel {
    /// No session.
    Off,
    /// Per-layer activation statistics and the anomaly rules.
    Lightweight,
    /// Also every attention row.
    Full,
}

impl TraceLevel {
    const DEFAULT: Self = if cfg!(feature = "trace") {
        Self::Full
    } else {
        Self::Off
    };
}

/// The sentence embedding of all-MiniLM-L6-v2, run by burn.
#[derive(Parser)]
#[command(name = "minilm-burn")]
struct Args {
    /// The sentence (its words may be separate arguments).
    #[arg(default_value = DEFAULT_SENTENCE)]
    words: Vec<String>,
    /// The burn backend: `ndarray`, `flex`, or `wgpu` (built with the `wgpu` feature).
    #[arg(long, default_value = "ndarray", value_parser = parse_backend)]
    device: Backend,
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
    /// The porting bugs to inject, `NAME[@LAYER][,...]` (the candle port's `minilm::bugs`),
    /// for the whole process (for the tests).
    #[arg(long, value_name = "BUGS", hide = true)]
    inject_bug: Option<String>,
}

fn parse_backend(name: &str) -> Result<Backend, String> {
    Backend::from_name(name).ok_or_else(|| {
        let wgpu = if cfg!(feature = "wgpu") {
            ", wgpu"
        } else {
            " (wgpu: build with --features wgpu)"
        };
        format!("no backend {name:?}: ndarray, flex{wgpu}")
    })
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
    // Empty unless built with `--features trace`. This crate's own: the candle port, linked for
    // its weights and tokenizer, registers its tracepoints too (they record nothing here).
    let ours = |module: &str| module.split("::").next() == Some(env!("CARGO_CRATE_NAME"));
    for tracepoint in model_trace::tracepoints() {
        if ours(tracepoint.module_path) {
            println!("{tracepoint}");
        }
    }
    let text = args.words.join(" ");
    let files = weights::locate_or_fetch()?;
    let device = args.device.device();
    let model = Model::load(&files, &device)?;
    let tokenizer = tokenizer::load(&files.tokenizer)?;
    let encoded = tokenizer::encode(&tokenizer, &text)?;
    let (ids, mask) = model::sentence_tensors(&encoded, &device);
    let backend = args.device.describe(&device);

    let config = match args.trace {
        TraceLevel::Off => None,
        _ if !cfg!(feature = "trace") => {
            eprintln!("note: built without `--features trace`; --trace has nothing to record");
            None
        }
        TraceLevel::Lightweight => Some(ModelTracerConfig::lightweight()),
        TraceLevel::Full => Some(ModelTracerConfig::full()),
    };
    let session = match config {
        Some(config) => {
            let mut builder = Session::builder(config)
                .from_env()
                .model("all-MiniLM-L6-v2")
                .weights(files.weights.display().to_string())
                .prompt(text.clone())
                .extra("token_ids", format!("{:?}", encoded.ids))
                .extra("framework", "burn 0.22")
                .dtype("f32")
                .device(backend.clone());
            if let Some(capture) = &args.capture {
                builder = builder.capture(capture.clone());
            }
            Some(match &args.trace_out {
                Some(path) => builder.trace_file(path).start()?,
                None => builder.start_lenient(),
            })
        }
        None => None,
    };
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let embedding = model.embed(ids, mask);
    let traced = session.map(Session::finish_with_errors);
    let embedding: Vec<f32> = embedding
        .into_data()
        .try_into_vec()
        .map_err(|e| format!("reading the embedding: {e}"))?;

    println!("text: {text:?}");
    println!("backend: {backend}");
    println!("tokens: {}", encoded.tokens.join(" "));
    println!("ids: {:?}", encoded.ids);
    let shown: Vec<String> = embedding
        .iter()
        .take(SHOWN_DIMS)
        .map(|v| format!("{v:.8}"))
        .collect();
    println!(
        "embedding ({} dims, first {}): [{}]",
        embedding.len(),
        shown.len(),
        shown.join(", ")
    );
    if let Some((tracer, errors)) = &traced {
        println!("{}", tracer.summary().to_string().trim_end());
        for error in errors {
            eprintln!("model-trace: not recorded: {error}");
        }
    }
    if let Some(file) = trace_file {
        println!("trace file: {}", file.display());
    }
    Ok(())
}
