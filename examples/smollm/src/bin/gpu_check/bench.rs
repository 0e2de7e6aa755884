//! `gpu_check bench`: the decode step of `model` untraced and traced, timed on one device.
//!
//! Five configurations: the unannotated twin; the annotated step with no session (the cost of
//! annotations that find none); a lightweight session in memory; full tracing without
//! quantization writing a trace file; the same with `DigestPolicy::Always`, which also digests
//! device tensors (a copy to the host each). Every configuration first runs one untimed pass,
//! whose logits must be bit-identical to the twin's. Then `--rounds` rounds: in each, every
//! configuration in turn (the order rotating from round to round) runs `--passes` passes in a
//! session of its own, each pass timed up to the device's synchronize. The table gives the
//! median over all passes and, as its interval, the lowest and highest of the round medians;
//! the ratio to the twin is that of the medians, with the lowest and highest of the per-round
//! ratios (a round's median over the twin's median in the same round, so that drift of the
//! machine between rounds cancels).

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use model_trace::{DigestPolicy, ModelTracerConfig, Session};
use serde_json::json;

use crate::args::BenchArgs;
use crate::device::{self, CUDA_BUILT};
use crate::model::{StepModel, TENSORS_PER_LAYER};
use crate::{median, write_json, Failure, TempDir};

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Twin,
    NoSession,
    Lightweight,
    FullFile,
    FullFileDigests,
}

impl Config {
    /// Each configuration, its key in the JSON and its label in the table.
    const NAMED: [(Self, &'static str, &'static str); 5] = [
        (Self::Twin, "twin", "unannotated twin"),
        (Self::NoSession, "no_session", "annotated, no session"),
        (
            Self::Lightweight,
            "lightweight",
            "annotated, lightweight session (in memory)",
        ),
        (
            Self::FullFile,
            "full_noquant_file",
            "annotated, full without quantization, trace file",
        ),
        (
            Self::FullFileDigests,
            "full_noquant_file_digests",
            "the same, DigestPolicy::Always",
        ),
    ];

    fn key(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(config, ..)| *config == self)
            .map_or("", |&(_, key, _)| key)
    }

    fn label(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(config, ..)| *config == self)
            .map_or("", |&(.., label)| label)
    }

    /// The session it runs in, and whether that session writes a trace file.
    fn session(self) -> Option<(ModelTracerConfig, bool)> {
        let full_noquant = || ModelTracerConfig {
            trace_quant_error: false,
            ..ModelTracerConfig::full()
        };
        match self {
            Self::Twin | Self::NoSession => None,
            Self::Lightweight => Some((ModelTracerConfig::lightweight(), false)),
            Self::FullFile => Some((full_noquant(), true)),
            Self::FullFileDigests => Some((
                ModelTracerConfig {
                    digests: DigestPolicy::Always,
                    ..full_noquant()
                },
                true,
            )),
        }
    }
}

/// Passes of one configuration in one session.
struct Block {
    times_ms: Vec<f64>,
    /// The last pass's logits.
    logits: Tensor,
    /// The trace file's size, for configurations that write one.
    trace_bytes: Option<u64>,
    /// Tensors the in-memory tracer holds, over all passes (0 for a file-backed session, which
    /// keeps only the summary in memory).
    tensors_recorded: usize,
}

/// What every block runs on.
struct Bench<'a> {
    model: &'a StepModel,
    input: &'a Tensor,
    device: &'a Device,
    /// Where the trace files go (removed after each block).
    dir: &'a Path,
}

impl Bench<'_> {
    /// `passes` timed passes of `config`, in a session of their own when it has one.
    fn block(&self, config: Config, passes: usize) -> Result<Block, Failure> {
        let session = match config.session() {
            None => None,
            Some((tracer_config, file)) => {
                let mut builder = Session::builder(tracer_config);
                if file {
                    builder = builder.trace_file(self.dir.join(format!("{}.ndjson", config.key())));
                }
                Some(builder.start().map_err(|e| {
                    Failure::Setup(format!(
                        "{}: the session does not start: {e}",
                        config.label()
                    ))
                })?)
            }
        };
        let mut times_ms = Vec::with_capacity(passes);
        let mut logits = None;
        for position in 0..passes {
            let start = Instant::now();
            let output = match config {
                Config::Twin => self.model.step_twin(self.input)?,
                _ => self.model.step(self.input, position)?,
            };
            self.device.synchronize()?;
            times_ms.push(start.elapsed().as_secs_f64() * 1e3);
            logits = Some(output);
        }
        let logits = logits.ok_or(Failure::Usage("--passes must be at least 1".into()))?;
        let (trace_bytes, tensors_recorded) = match session {
            Some(session) => finish(session, config)?,
            None => (None, 0),
        };
        Ok(Block {
            times_ms,
            logits,
            trace_bytes,
            tensors_recorded,
        })
    }
}

/// Ends a block's session: record errors fail the benchmark (its figures would not be those of
/// tracing). Returns the trace file's size (the file is removed) and how many tensors the
/// in-memory tracer holds.
fn finish(session: Session, config: Config) -> Result<(Option<u64>, usize), Failure> {
    let file = session.trace_file().map(Path::to_path_buf);
    let (tracer, errors) = session.finish_with_errors();
    let tensors = crate::tensors_recorded(&tracer);
    if let Some(first) = errors.first() {
        return Err(Failure::Failed(format!(
            "{}: {} kinds of record errors, first: {first}",
            config.label(),
            errors.len()
        )));
    }
    let Some(file) = file else {
        return Ok((None, tensors));
    };
    let bytes = std::fs::metadata(&file)
        .map_err(|e| Failure::Setup(format!("no trace file {}: {e}", file.display())))?
        .len();
    std::fs::remove_file(&file)
        .map_err(|e| Failure::Setup(format!("cannot remove {}: {e}", file.display())))?;
    Ok((Some(bytes), tensors))
}

/// One configuration's figures.
struct Figures {
    config: Config,
    /// Per round, each pass's time.
    rounds: Vec<Vec<f64>>,
    trace_bytes: Vec<u64>,
}

impl Figures {
    fn all_passes(&self) -> Vec<f64> {
        self.rounds.concat()
    }

    fn median_ms(&self) -> f64 {
        median(&self.all_passes())
    }

    fn round_medians(&self) -> Vec<f64> {
        self.rounds.iter().map(|times| median(times)).collect()
    }

    /// Bytes of trace file per pass (the whole file, header included, over its passes).
    fn trace_bytes_per_pass(&self, passes: usize) -> Option<f64> {
        (!self.trace_bytes.is_empty()).then(|| {
            self.trace_bytes.iter().sum::<u64>() as f64 / (self.trace_bytes.len() * passes) as f64
        })
    }
}

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    let opened = device::open(args.device)?;
    let device = &opened.device;
    let dtype_name = args.dtype.as_str();
    let tensors = args.layers * TENSORS_PER_LAYER;
    eprintln!(
        "gpu_check bench: {}, {dtype_name}, {} blocks × {TENSORS_PER_LAYER} traced tensors = \
         {tensors} a pass, {} rounds of {} passes; tracing {}, cuda {}",
        opened.name,
        args.layers,
        args.rounds,
        args.passes,
        built(model_trace::ENABLED),
        built(CUDA_BUILT),
    );
    if !model_trace::ENABLED {
        eprintln!(
            "note: built without `--features trace`: the annotations are compiled out and \
             sessions record nothing, so every configuration measures the untraced step"
        );
    }
    let start = Instant::now();
    let model = StepModel::random(args.layers, args.dtype, device)?;
    let input = StepModel::input(args.dtype, device)?;
    device.synchronize()?;
    eprintln!(
        "random weights made in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let dir = TempDir::new()?;
    let bench = Bench {
        model: &model,
        input: &input,
        device,
        dir: &dir.0,
    };
    let mismatches = warm_up(&bench, tensors)?;
    let mut figures: Vec<Figures> = Config::NAMED
        .iter()
        .map(|&(config, ..)| Figures {
            config,
            rounds: Vec::new(),
            trace_bytes: Vec::new(),
        })
        .collect();
    for round in 0..args.rounds {
        for turn in 0..figures.len() {
            let figure = &mut figures[(round + turn) % Config::NAMED.len()];
            let block = bench.block(figure.config, args.passes)?;
            figure.rounds.push(block.times_ms);
            figure.trace_bytes.extend(block.trace_bytes);
        }
        eprintln!("round {} of {} done", round + 1, args.rounds);
    }
    print_table(&figures, args);
    if let Some(path) = &args.json {
        write_json(path, &to_json(&figures, args, opened.name, tensors))?;
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "the annotated step does not do what the twin does: {}",
            mismatches.join("; ")
        )))
    }
}

fn built(on: bool) -> &'static str {
    if on {
        "compiled in"
    } else {
        "compiled out"
    }
}

/// One untimed pass of every configuration (the first pass pays for kernel loading and
/// allocations); each one's logits against the twin's, and the lightweight session's count of
/// recorded tensors against `tensors`. Returns what did not match.
fn warm_up(bench: &Bench<'_>, tensors: usize) -> Result<Vec<String>, Failure> {
    let twin = logit_bits(&bench.block(Config::Twin, 1)?.logits)?;
    let mut mismatches = Vec::new();
    for &(config, ..) in &Config::NAMED[1..] {
        let block = bench.block(config, 1)?;
        if config == Config::Lightweight
            && model_trace::ENABLED
            && block.tensors_recorded != tensors
        {
            mismatches.push(format!(
                "{}: {} tensors recorded in a pass, not {tensors}",
                config.label(),
                block.tensors_recorded
            ));
        }
        let logits = logit_bits(&block.logits)?;
        let differing = logits.iter().zip(&twin).filter(|(a, b)| a != b).count();
        if differing > 0 || logits.len() != twin.len() {
            mismatches.push(format!(
                "{}: {differing} of {} logits differ",
                config.label(),
                twin.len()
            ));
        }
    }
    Ok(mismatches)
}

fn logit_bits(logits: &Tensor) -> candle_core::Result<Vec<u32>> {
    let values = logits
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    Ok(values.into_iter().map(f32::to_bits).collect())
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), &v| {
            (low.min(v), high.max(v))
        })
}

/// Per round, the configuration's median over the twin's.
fn round_ratios(figure: &Figures, twin: &Figures) -> Vec<f64> {
    figure
        .round_medians()
        .iter()
        .zip(twin.round_medians())
        .map(|(median, twin)| median / twin)
        .collect()
}

fn print_table(figures: &[Figures], args: &BenchArgs) {
    let twin = &figures[0];
    let twin_median = twin.median_ms();
    println!(
        "\n| configuration | ms/pass | round medians (min–max) | × twin | per-round × twin \
         (min–max) | trace file/pass |\n|---|---:|---:|---:|---:|---:|"
    );
    for figure in figures {
        let (low, high) = min_max(&figure.round_medians());
        let (ratio_low, ratio_high) = min_max(&round_ratios(figure, twin));
        let bytes = figure
            .trace_bytes_per_pass(args.passes)
            .map_or(String::new(), |b| format!("{:.1} KB", b / 1e3));
        println!(
            "| {} | {:.3} | {low:.3}–{high:.3} | {:.2}× | {ratio_low:.2}–{ratio_high:.2}× | {bytes} |",
            figure.config.label(),
            figure.median_ms(),
            figure.median_ms() / twin_median,
        );
    }
    println!(
        "\nms/pass: median of all {} passes (each up to the device's synchronize); interval: the \
         lowest and highest of the {} round medians{}. × twin: ratio of the medians; per-round: \
         each round's median over the twin's median in that round.",
        args.rounds * args.passes,
        args.rounds,
        if args.rounds < 2 {
            " (one round: no interval)"
        } else {
            ""
        }
    );
}

fn to_json(
    figures: &[Figures],
    args: &BenchArgs,
    device: &str,
    tensors: usize,
) -> serde_json::Value {
    let twin = &figures[0];
    let twin_median = twin.median_ms();
    let configs: Vec<serde_json::Value> = figures
        .iter()
        .map(|figure| {
            let medians = figure.round_medians();
            let (low, high) = min_max(&medians);
            let ratios = round_ratios(figure, twin);
            let (ratio_low, ratio_high) = min_max(&ratios);
            json!({
                "config": figure.config.key(),
                "label": figure.config.label(),
                "median_ms": figure.median_ms(),
                "interval_ms": [low, high],
                "round_medians_ms": medians,
                "ratio_to_twin": figure.median_ms() / twin_median,
                "round_ratio_interval": [ratio_low, ratio_high],
                "trace_bytes_per_pass": figure.trace_bytes_per_pass(args.passes),
            })
        })
        .collect();
    json!({
        "command": "bench",
        "device": device,
        "dtype": args.dtype.as_str(),
        "layers": args.layers,
        "traced_tensors_per_pass": tensors,
        "rounds": args.rounds,
        "passes": args.passes,
        "tracing_compiled_in": model_trace::ENABLED,
        "cuda_built": CUDA_BUILT,
        "interval": "min-max of round medians",
        "configs": configs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(config: Config, rounds: &[&[f64]], trace_bytes: &[u64]) -> Figures {
        Figures {
            config,
            rounds: rounds.iter().map(|r| r.to_vec()).collect(),
            trace_bytes: trace_bytes.to_vec(),
        }
    }

    #[test]
    fn ratios_are_taken_round_by_round() {
        let twin = figures(
            Config::Twin,
            &[&[10.0, 12.0, 11.0], &[20.0, 20.0, 20.0]],
            &[],
        );
        let traced = figures(
            Config::FullFile,
            &[&[15.0, 16.0, 17.0], &[30.0, 31.0, 29.0]],
            &[1000, 3000],
        );
        assert_eq!(traced.round_medians(), [16.0, 30.0]);
        assert_eq!(min_max(&round_ratios(&traced, &twin)), (16.0 / 11.0, 1.5));
        assert_eq!(traced.median_ms(), 23.0);
        assert_eq!(traced.trace_bytes_per_pass(3), Some(4000.0 / 6.0));
        assert_eq!(twin.trace_bytes_per_pass(3), None);
    }

    #[test]
    fn configurations_have_distinct_names_and_the_twin_first() {
        assert_eq!(Config::NAMED[0].0, Config::Twin);
        for (i, &(config, key, label)) in Config::NAMED.iter().enumerate() {
            assert_eq!((config.key(), config.label()), (key, label));
            assert!(Config::NAMED[..i]
                .iter()
                .all(|&(_, k, l)| k != key && l != label));
        }
        assert!(Config::Twin.session().is_none() && Config::NoSession.session().is_none());
        let Some((digests, true)) = Config::FullFileDigests.session() else {
            panic!("full with digests writes a file");
        };
        assert_eq!(digests.digests, DigestPolicy::Always);
        assert!(!digests.trace_quant_error && digests.trace_attention);
    }
}
