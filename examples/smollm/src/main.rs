//! `smollm "The capital of France is"`: greedy continuation of a prompt with SmolLM2-135M,
//! traced by model-trace when built with `--features trace`.

use model_trace::{ModelTracer, ModelTracerConfig, RecordError, Session, SessionError};
use model_trace::{Precision, SessionBuilder, TraceReader};
use smollm::generate::{encode_prompt, greedy_split, load, Generation};
use smollm::passes::{greedy_batch, Split};
use smollm::pipeline::Pipeline;
use smollm::quant_linear::dtype_text;
use smollm::report::quant_figures;
use smollm::{weights, GgufTokenizer, Model, TraceLevel};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: smollm [--max-tokens N] [--ignore-eos] \
                     [--trace off|lightweight|full-noquant|full] [--logit-lens] [--pipeline N] \
                     [--trace-out FILE [--capture PATTERN]] [--rows] [--dequantize] \
                     [--max-prompt-tokens N] \
                     [--decode-from K | --prefill-chunk C] PROMPT... (or --prompt-file PATH)\n\
                     --prompt-file reads a prompt from a file (a prompt argument of its own, \
                     in its place among the others); --max-prompt-tokens cuts each prompt's ids \
                     to the first N;\n\
                     --decode-from prefills the first K prompt tokens in one pass, then feeds \
                     the rest one token a pass; --prefill-chunk prefills in passes of C tokens;\n\
                     several prompts run as one batch: left-padded to the longest, prefilled \
                     in one pass and decoded together for --max-tokens steps (no --pipeline, \
                     --logit-lens, --decode-from or --prefill-chunk), each row's text printed;\n\
                     --ignore-eos goes on past the end-of-text token, so exactly N tokens are \
                     generated (for measuring);\n\
                     --trace defaults to full when built with --features trace, else off;\n\
                     --trace-out writes the trace file (also MODEL_TRACE_OUT=FILE), --capture saves \
                     the tensors it selects in full beside it (also MODEL_TRACE_CAPTURE);\n\
                     --rows summarises every layer tensor row by row too (each position's norm, \
                     sketch and fingerprint), for `model-trace diff` by position; --dequantize \
                     runs every matmul on its dequantized f32 weight (no 8-bit rounding of the \
                     activations: the floor of a comparison by position drops to f32 rounding; \
                     candle's CANDLE_DEQUANTIZE_ALL=1 does the same), as the trace header's \
                     precision says;\n\
                     --pipeline runs the model as N stages of consecutive layers (2: layers 0-14 \
                     and 15-29), each on a thread of its own and traced as rank r of N: \
                     --trace-out run.ndjson writes run.rank0.ndjson, run.rank1.ndjson, ... \
                     (no --logit-lens)";

/// A prompt as the command line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PromptArg {
    Text(String),
    /// `--prompt-file PATH`: the file's text.
    File(PathBuf),
}

struct Args {
    /// One prompt, or several: a batch.
    prompts: Vec<PromptArg>,
    /// `--max-prompt-tokens`: each prompt's ids cut to this many.
    max_prompt_tokens: Option<usize>,
    /// How the prompt is prefilled (`--decode-from`, `--prefill-chunk`).
    split: Split,
    max_tokens: usize,
    ignore_eos: bool,
    trace: TraceLevel,
    logit_lens: bool,
    /// Stages of a pipeline-parallel run; `None` runs the whole model on the main thread.
    pipeline: Option<usize>,
    trace_out: Option<String>,
    capture: Option<String>,
    /// `--rows`: every layer tensor summarised row by row too.
    rows: bool,
    /// `--dequantize`: every matmul on its dequantized f32 weight.
    dequantize: bool,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut prompts = Vec::new();
    let mut max_prompt_tokens = None;
    let mut splits = Vec::new();
    let mut max_tokens = 16;
    let mut ignore_eos = false;
    let mut trace = TraceLevel::DEFAULT;
    let mut logit_lens = false;
    let mut pipeline = None;
    let (mut trace_out, mut capture) = (None, None);
    let (mut rows, mut dequantize) = (false, false);
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
            "--prompt-file" => prompts.push(PromptArg::File(value("--prompt-file")?.into())),
            "--max-prompt-tokens" => {
                max_prompt_tokens = Some(count("--max-prompt-tokens", &value(&flag)?)?);
            }
            "--decode-from" => {
                splits.push(Split::DecodeFrom(count("--decode-from", &value(&flag)?)?));
            }
            "--prefill-chunk" => {
                splits.push(Split::Chunks(count("--prefill-chunk", &value(&flag)?)?));
            }
            "--trace-out" => trace_out = Some(value("--trace-out")?),
            "--capture" => capture = Some(value("--capture")?),
            "--rows" => rows = true,
            "--dequantize" => dequantize = true,
            // Test-only (not in the usage): the porting bugs to inject, `NAME[@LAYER][,...]`
            // (`smollm::bugs`), for the whole process.
            "--inject-bug" => {
                let bugs = value("--inject-bug")?;
                smollm::bugs::inject_list(&bugs)?;
            }
            "-h" | "--help" => return Err(String::new()),
            f if f.starts_with("--") => return Err(format!("unknown flag {f}")),
            _ => prompts.push(PromptArg::Text(arg)),
        }
    }
    Args {
        prompts,
        max_prompt_tokens,
        split: one_split(&splits)?,
        max_tokens,
        ignore_eos,
        trace,
        logit_lens,
        pipeline,
        trace_out,
        capture,
        rows,
        dequantize,
    }
    .checked()
}

/// The split `--decode-from` or `--prefill-chunk` asks for (one of them, once), else one pass.
fn one_split(splits: &[Split]) -> Result<Split, String> {
    match splits {
        [] => Ok(Split::Whole),
        [split] => Ok(*split),
        _ => Err("give one of --decode-from and --prefill-chunk, once".into()),
    }
}

impl Args {
    /// The arguments, or why they do not go together.
    fn checked(self) -> Result<Self, String> {
        if self.logit_lens && self.pipeline.is_some() {
            return Err(
                "--logit-lens needs the whole model on one thread; leave out --pipeline".into(),
            );
        }
        let batch = self.prompts.len() > 1;
        if self.prompts.is_empty() {
            Err("no prompt given".into())
        } else if batch
            && (self.pipeline.is_some() || self.logit_lens || self.split != Split::Whole)
        {
            Err(
                "several prompts run as one batch, prefilled in one pass by the whole model: \
                 leave out --pipeline, --logit-lens, --decode-from and --prefill-chunk"
                    .into(),
            )
        } else {
            Ok(self)
        }
    }
}

/// `value` of `flag` as a number above 0.
fn count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} takes a number above 0, not {value:?}")),
    }
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
    if args.dequantize {
        model.dequantize_matmuls()?;
    }
    // Pads a batch's shorter rows: any id of the vocabulary would do (the mask hides them).
    let pad_id = tokenizer.eos_id;
    if args.ignore_eos {
        // `greedy` stops at the tokenizer's end-of-text id; no token has this one.
        tokenizer.eos_id = u32::MAX;
    }
    let prompts = read_prompts(args, &tokenizer)?;
    model.logit_lens = args.logit_lens;

    let level = args.trace.effective();
    let config = level.config().map(|config| ModelTracerConfig {
        row_summaries: args.rows,
        ..config
    });
    let settings = SessionSettings::of_run(&path, &prompts, args, model.precision());
    let (outcome, traces) = match (&prompts[..], args.pipeline) {
        ([prompt], None) => {
            generate_whole(model, &tokenizer, prompt, args, config.clone(), &settings)?
        }
        ([prompt], Some(stages)) => generate_pipelined(
            model,
            stages,
            &tokenizer,
            prompt,
            args,
            config.clone(),
            settings,
        )?,
        (prompts, _) => generate_batch(model, prompts, pad_id, args, config.clone(), &settings)?,
    };
    outcome.print_text(&prompts, &tokenizer, args.logit_lens)?;
    print_traces(&traces, level)?;
    outcome.print_timing();
    Ok(())
}

/// A prompt of the run: its text (as printed before the continuation) and its ids.
struct Prompt {
    text: String,
    ids: Vec<u32>,
}

/// The prompts of the command line, read and encoded, each cut to `--max-prompt-tokens` ids (a
/// prompt that was cut is its ids' text).
fn read_prompts(args: &Args, tokenizer: &GgufTokenizer) -> smollm::Result<Vec<Prompt>> {
    let mut prompts = Vec::with_capacity(args.prompts.len());
    for prompt in &args.prompts {
        let text = match prompt {
            PromptArg::Text(text) => text.clone(),
            PromptArg::File(path) => {
                std::fs::read_to_string(path).map_err(|source| smollm::Error::PromptFile {
                    path: path.clone(),
                    source,
                })?
            }
        };
        let mut ids = encode_prompt(tokenizer, &text)?;
        match args.max_prompt_tokens {
            Some(max) if ids.len() > max => {
                ids.truncate(max);
                prompts.push(Prompt {
                    text: tokenizer.decode(&ids)?,
                    ids,
                });
            }
            _ => prompts.push(Prompt { text, ids }),
        }
    }
    Ok(prompts)
}

/// What the run generated: one prompt's continuation, or a batch's rows.
enum Outcome {
    One(Generation),
    Batch {
        /// Each row's generated ids.
        rows: Vec<Vec<u32>>,
        /// The batch's passes, all of them.
        elapsed: Duration,
    },
}

impl Outcome {
    /// Each prompt followed by its continuation (a row's cut after its end-of-text token),
    /// then, with the logit lens, each layer's top token.
    fn print_text(
        &self,
        prompts: &[Prompt],
        tokenizer: &GgufTokenizer,
        logit_lens: bool,
    ) -> smollm::Result<()> {
        match self {
            Self::One(generation) => {
                println!("{}{}", prompts[0].text, generation.text);
                if logit_lens {
                    println!("logit lens (top token per layer, first generated token):");
                    for (layer, &id) in generation.prefill_lens_top.iter().enumerate() {
                        println!("  layer {layer:2}: {:?}", tokenizer.decode(&[id])?);
                    }
                }
            }
            Self::Batch { rows, .. } => {
                for (prompt, row) in prompts.iter().zip(rows) {
                    let end = row
                        .iter()
                        .position(|&id| id == tokenizer.eos_id)
                        .map_or(row.len(), |at| at + 1);
                    println!("{}{}", prompt.text, tokenizer.decode(&row[..end])?);
                }
            }
        }
        Ok(())
    }

    fn print_timing(&self) {
        match self {
            Self::One(generation) => print_decode_timing(generation),
            Self::Batch { rows, elapsed } => println!(
                "batch: {} rows, {} tokens each, in {:.1} ms (the prefill and {} decode passes)",
                rows.len(),
                rows.first().map_or(0, Vec::len),
                elapsed.as_secs_f64() * 1e3,
                rows.first().map_or(0, |row| row.len().saturating_sub(1)),
            ),
        }
    }
}

/// Each session's summary (per stage for a pipeline), the quantization error per matmul kind
/// at `full`, what was not recorded, and the trace files' sizes.
fn print_traces(traces: &[Trace], level: TraceLevel) -> smollm::Result<()> {
    for trace in traces {
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
    Ok(())
}

fn print_decode_timing(generation: &Generation) {
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

/// Greedy decoding of `prompt` with the whole model on this thread, inside one session when
/// traced.
fn generate_whole(
    mut model: Model,
    tokenizer: &GgufTokenizer,
    prompt: &Prompt,
    args: &Args,
    config: Option<ModelTracerConfig>,
    settings: &SessionSettings,
) -> smollm::Result<(Outcome, Vec<Trace>)> {
    let (generation, trace) = traced(config, settings, || {
        let ids = prompt.ids.clone();
        greedy_split(&mut model, tokenizer, ids, args.split, args.max_tokens)
    })?;
    Ok((Outcome::One(generation?), vec![trace]))
}

/// A batch of `prompts` decoded together with the whole model on this thread, inside one
/// session when traced.
fn generate_batch(
    mut model: Model,
    prompts: &[Prompt],
    pad_id: u32,
    args: &Args,
    config: Option<ModelTracerConfig>,
    settings: &SessionSettings,
) -> smollm::Result<(Outcome, Vec<Trace>)> {
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let started = Instant::now();
    let (rows, trace) = traced(config, settings, || {
        greedy_batch(&mut model, &ids, pad_id, args.max_tokens)
    })?;
    let outcome = Outcome::Batch {
        rows: rows?,
        elapsed: started.elapsed(),
    };
    Ok((outcome, vec![trace]))
}

/// `run` inside a session of `config` (none when `None`): what it returns, and what the session
/// recorded.
fn traced<T>(
    config: Option<ModelTracerConfig>,
    settings: &SessionSettings,
    run: impl FnOnce() -> T,
) -> smollm::Result<(T, Trace)> {
    let session = config
        .map(|config| settings.start(config, None))
        .transpose()?;
    let trace_file = session
        .as_ref()
        .and_then(|s| s.trace_file().map(|p| p.to_path_buf()));
    let value = run();
    let traced = session.map(Session::finish_with_errors);
    let trace = Trace {
        stage: None,
        trace_file,
        traced,
    };
    Ok((value, trace))
}

/// Greedy decoding with the model cut into `stages` pipeline stages, each on a thread of its own
/// and, when traced, in a session of its own as rank r of `stages`.
fn generate_pipelined(
    model: Model,
    stages: usize,
    tokenizer: &GgufTokenizer,
    prompt: &Prompt,
    args: &Args,
    config: Option<ModelTracerConfig>,
    settings: SessionSettings,
) -> smollm::Result<(Outcome, Vec<Trace>)> {
    let mut pipeline = match config {
        Some(config) => Pipeline::spawn_traced(model, stages, move |rank, world_size| {
            settings.start(config.clone(), Some((rank, world_size)))
        })?,
        None => Pipeline::spawn(model, stages)?,
    };
    let ids = prompt.ids.clone();
    let generation = greedy_split(&mut pipeline, tokenizer, ids, args.split, args.max_tokens);
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
    Ok((Outcome::One(generation?), traces))
}

/// What the sessions of a traced run are told, on whichever thread they start.
struct SessionSettings {
    weights: String,
    prompt: String,
    prompt_ids: String,
    trace_out: Option<String>,
    capture: Option<String>,
    /// What the run computes in (the model's, [`Model::precision`]).
    precision: Precision,
}

impl SessionSettings {
    /// The settings of a run of `weights` on `prompts` (several: a batch, their texts one a
    /// line and their ids row by row) that computes in `precision`.
    fn of_run(weights: &Path, prompts: &[Prompt], args: &Args, precision: Precision) -> Self {
        let (prompt, prompt_ids) = match prompts {
            [one] => (one.text.clone(), format!("{:?}", one.ids)),
            _ => {
                let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
                let ids: Vec<&Vec<u32>> = prompts.iter().map(|p| &p.ids).collect();
                (texts.join("\n"), format!("{ids:?}"))
            }
        };
        Self {
            weights: weights.display().to_string(),
            prompt,
            prompt_ids,
            trace_out: args.trace_out.clone(),
            capture: args.capture.clone(),
            precision,
        }
    }

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
            .dtype(dtype_text(&self.precision))
            .precision(self.precision.clone())
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
    use super::{parse_args, PromptArg, Split};

    fn parse(args: &[&str]) -> Result<super::Args, String> {
        parse_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn ignore_eos_is_off_unless_asked_for() {
        let args = parse(&["--max-tokens", "200", "hi"]).unwrap();
        assert_eq!((args.max_tokens, args.ignore_eos), (200, false));
        let args = parse(&["--max-tokens=1000", "--ignore-eos", "hi"]).unwrap();
        assert_eq!((args.max_tokens, args.ignore_eos), (1000, true));
        assert_eq!(args.prompts, [PromptArg::Text("hi".into())]);
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

    #[test]
    fn prompts_come_from_arguments_and_files_in_their_order() {
        let args = parse(&[
            "a",
            "--prompt-file",
            "b.txt",
            "c",
            "--max-prompt-tokens=600",
        ])
        .unwrap();
        assert_eq!(
            args.prompts,
            [
                PromptArg::Text("a".into()),
                PromptArg::File("b.txt".into()),
                PromptArg::Text("c".into())
            ]
        );
        assert_eq!(args.max_prompt_tokens, Some(600));
        assert_eq!(args.split, Split::Whole);
        assert_eq!(
            parse(&["--max-tokens", "2"]).err().unwrap(),
            "no prompt given"
        );
    }

    #[test]
    fn a_prompt_is_prefilled_from_k_or_in_chunks_not_both() {
        let args = parse(&["--decode-from", "500", "hi"]).unwrap();
        assert_eq!(args.split, Split::DecodeFrom(500));
        let args = parse(&["--prefill-chunk=64", "hi"]).unwrap();
        assert_eq!(args.split, Split::Chunks(64));
        let error = parse(&["--decode-from", "5", "--prefill-chunk", "2", "hi"])
            .err()
            .unwrap();
        assert!(
            error.contains("one of --decode-from and --prefill-chunk"),
            "{error}"
        );
        for flag in ["--decode-from", "--prefill-chunk", "--max-prompt-tokens"] {
            let error = parse(&[flag, "0", "hi"]).err().unwrap();
            assert_eq!(error, format!("{flag} takes a number above 0, not \"0\""));
        }
    }

    #[test]
    fn several_prompts_are_a_batch_of_the_whole_model_prefilled_in_one_pass() {
        assert_eq!(parse(&["a", "b", "c"]).unwrap().prompts.len(), 3);
        for flags in [
            &["--pipeline", "2"][..],
            &["--logit-lens"],
            &["--decode-from", "1"],
            &["--prefill-chunk", "1"],
        ] {
            let mut args = flags.to_vec();
            args.extend(["a", "b"]);
            let error = parse(&args).err().unwrap();
            assert!(
                error.starts_with("several prompts run as one batch"),
                "{error}"
            );
        }
    }
}
