//! `smollm "The capital of France is"`: greedy continuation of a prompt with SmolLM2-135M,
//! traced by model-trace when built with `--features trace`.

use model_trace::{ModelTracer, ModelTracerConfig, RecordError, Session, SessionError};
use model_trace::{SessionBuilder, TraceReader};
use smollm::generate::{greedy, load, Generation};
use smollm::pipeline::Pipeline;
use smollm::report::quant_figures;
use smollm::{weights, GgufTokenizer, Model, TraceLevel};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: smollm [--max-tokens N] [--ignore-eos] \
                     [--trace off|lightweight|full-noquant|full] [--logit-lens] [--pipeline N] \
                     [--trace-out FILE [--capture PATTERN]] PROMPT\n\
                     --ignore-eos goes on past the end-of-text token, so exactly N tokens are \
                     generated (for measuring);\n\
                     --trace defaults to full when built with --features trace, else off;\n\
                     --trace-out writes the trace file (also MODEL_TRACE_OUT=FILE), --capture saves \
                     the tensors it selects in full beside it (also MODEL_TRACE_CAPTURE);\n\
                     --pipeline runs the model as N stages of consecutive layers (2: layers 0-14 \
                     and 15-29), each on a thread of its own and traced as rank r of N: \
                     --trace-out run.ndjson writes run.rank0.ndjson, run.rank1.ndjson, ... \
                     (no --logit-lens)";

struct Args {
    prompt: String,
    max_tokens: usize,
    ignore_eos: bool,
    trace: TraceLevel,
    logit_lens: bool,
    /// Stages of a pipeline-parallel run; `None` runs the whole model on the main thread.
    pipeline: Option<usize>,
    trace_out: Option<String>,
    capture: Option<String>,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompt: Option<String> = None;
    let mut max_tokens = 16;
    let mut ignore_eos = false;
    let mut trace = TraceLevel::DEFAULT;
    let mut logit_lens = false;
    let mut pipeline = None;
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
            "--ignore-eos" => ignore_eos = true,
            "--trace" => trace = value("--trace")?.parse()?,
            "--logit-lens" => logit_lens = true,
            "--pipeline" => {
                let v = value("--pipeline")?;
                match v.parse() {
                    Ok(stages) if stages > 0 => pipeline = Some(stages),
                    _ => return Err(format!("--pipeline takes a number of stages, not {v:?}")),
                }
            }
            "--trace-out" => trace_out = Some(value("--trace-out")?),
            "--capture" => capture = Some(value("--capture")?),
            // Test-only (not in the usage): the porting bugs to inject, `NAME[@LAYER][,...]`
            // (`smollm::bugs`), for the whole process.
            "--inject-bug" => {
                let bugs = value("--inject-bug")?;
                smollm::bugs::inject_list(&bugs)?;
            }
            "-h" | "--help" => return Err(String::new()),
            f if f.starts_with("--") => return Err(format!("unknown flag {f}")),
            _ if prompt.is_some() => return Err("give the prompt as one argument".into()),
            _ => prompt = Some(arg),
        }
    }
    if logit_lens && pipeline.is_some() {
        return Err(
            "--logit-lens needs the whole model on one thread; leave out --pipeline".into(),
        );
    }
    Ok(Args {
        prompt: prompt.ok_or("no prompt given")?,
        max_tokens,
        ignore_eos,
        trace,
        logit_lens,
        pipeline,
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

fn run(args: &Args) -> smollm::Result<()> {
    // Empty unless built with `--features trace`.
    for tracepoint in model_trace::tracepoints() {
        println!("{tracepoint}");
    }
    let path = weights::locate_or_fetch()?;
    let (mut model, mut tokenizer) = load(&path)?;
    if args.ignore_eos {
        // `greedy` stops at the tokenizer's end-of-text id; no token has this one.
        tokenizer.eos_id = u32::MAX;
    }
    let prompt_ids = smollm::generate::encode_prompt(&tokenizer, &args.prompt)?;
    model.logit_lens = args.logit_lens;

    let level = args.trace.effective();
    let settings = SessionSettings {
        weights: path.display().to_string(),
        prompt: args.prompt.clone(),
        prompt_ids: format!("{prompt_ids:?}"),
        trace_out: args.trace_out.clone(),
        capture: args.capture.clone(),
    };
    let (generation, traces) = match args.pipeline {
        None => generate_whole(model, &tokenizer, args, level.config(), &settings)?,
        Some(stages) => {
            generate_pipelined(model, stages, &tokenizer, args, level.config(), settings)?
        }
    };
    println!("{}{}", args.prompt, generation.text);

    if args.logit_lens {
        println!("logit lens (top token per layer, first generated token):");
        for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
            println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
        }
    }
    for trace in &traces {
        let Some((tracer, errors)) = &trace.traced else {
            continue;
        };
        if let Some(stage) = &trace.stage {
            println!("{stage}:");
        }
        println!("{}", tracer.summary());
        if level == TraceLevel::Full {
            println!("quantization error per matmul kind:");
            let replayed = match &trace.trace_file {
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
    for file in traces.iter().filter_map(|trace| trace.trace_file.as_ref()) {
        let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
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

/// What one session recorded: the whole model's, or one pipeline stage's.
struct Trace {
    /// The stage it recorded, as the output names it; `None` for the whole model.
    stage: Option<String>,
    trace_file: Option<PathBuf>,
    /// `None` when the run was not traced.
    traced: Option<(ModelTracer, Vec<RecordError>)>,
}

/// Greedy decoding with the whole model on this thread, inside one session when traced.
fn generate_whole(
    mut model: Model,
    tokenizer: &GgufTokenizer,
    args: &Args,
    config: Option<ModelTracerConfig>,
    settings: &SessionSettings,
) -> smollm::Result<(Generation, Vec<Trace>)> {
    let session = config
        .map(|config| settings.start(config, None))
        .transpose()?;
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let generation = greedy(&mut model, tokenizer, &args.prompt, args.max_tokens);
    let traced = session.map(Session::finish_with_errors);
    let trace = Trace {
        stage: None,
        trace_file,
        traced,
    };
    Ok((generation?, vec![trace]))
}

/// Greedy decoding with the model cut into `stages` pipeline stages, each on a thread of its own
/// and, when traced, in a session of its own as rank r of `stages`.
fn generate_pipelined(
    model: Model,
    stages: usize,
    tokenizer: &GgufTokenizer,
    args: &Args,
    config: Option<ModelTracerConfig>,
    settings: SessionSettings,
) -> smollm::Result<(Generation, Vec<Trace>)> {
    let mut pipeline = match config {
        Some(config) => Pipeline::spawn_traced(model, stages, move |rank, world_size| {
            settings.start(config.clone(), Some((rank, world_size)))
        })?,
        None => Pipeline::spawn(model, stages)?,
    };
    let generation = greedy(&mut pipeline, tokenizer, &args.prompt, args.max_tokens);
    let traces = pipeline
        .finish()?
        .into_iter()
        .map(|stage| Trace {
            stage: Some(format!(
                "rank {} of {stages} (layers {}-{})",
                stage.rank,
                stage.layers.start,
                stage.layers.end - 1
            )),
            trace_file: stage.trace_file,
            traced: stage.traced,
        })
        .collect();
    Ok((generation?, traces))
}

/// What the sessions of a traced run are told, on whichever thread they start.
struct SessionSettings {
    weights: String,
    prompt: String,
    prompt_ids: String,
    trace_out: Option<String>,
    capture: Option<String>,
}

impl SessionSettings {
    /// A session of the run: the environment's settings, the command line's `--trace-out` and
    /// `--capture` over them, `rank` (rank, world size) for a pipeline stage, and what the header
    /// should say about the run. A trace file asked for on the command line must be writable; one
    /// from the environment is skipped with a note.
    fn start(
        &self,
        config: ModelTracerConfig,
        rank: Option<(usize, usize)>,
    ) -> Result<Session, SessionError> {
        let mut builder: SessionBuilder = Session::builder(config)
            .weights(self.weights.clone())
            .extra("prompt_ids", self.prompt_ids.clone())
            .from_env()
            .model("SmolLM2-135M-Instruct (Q4_1 GGUF)")
            .prompt(self.prompt.clone())
            .dtype("Q4_1 and Q8_0 weights, f32 activations")
            .device("cpu");
        if let Some((rank, world_size)) = rank {
            builder = builder.rank(rank, world_size);
        }
        if let Some(capture) = &self.capture {
            builder = builder.capture(capture.clone());
        }
        match &self.trace_out {
            Some(path) => builder.trace_file(path).start(),
            None => Ok(builder.start_lenient()),
        }
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

    #[test]
    fn pipeline_takes_a_number_of_stages_and_no_logit_lens() {
        assert_eq!(parse(&["hi"]).unwrap().pipeline, None);
        assert_eq!(parse(&["--pipeline", "2", "hi"]).unwrap().pipeline, Some(2));
        assert_eq!(parse(&["--pipeline=3", "hi"]).unwrap().pipeline, Some(3));
        for stages in ["0", "two", "-1"] {
            let error = parse(&["--pipeline", stages, "hi"]).err().unwrap();
            assert!(
                error.starts_with("--pipeline takes a number of stages"),
                "{error}"
            );
        }
        let error = parse(&["--pipeline", "2", "--logit-lens", "hi"])
            .err()
            .unwrap();
        assert!(error.contains("leave out --pipeline"), "{error}");
    }
}
