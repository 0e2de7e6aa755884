//! Long runs through the `model-trace` command: how fast `list`, `summary`, `report` and `diff`
//! read two full traces of a long SmolLM2-135M decode, and how much memory each one takes.
//!
//! ```sh
//! cargo bench -p trace-cli --bench long_run -- [--passes N] [--rounds R] [--dir DIR] [--keep]
//!     [--reuse] [--diverge-at PASS] [--binary PATH] [--json OUT]
//! ```
//!
//! It writes two trace files, A and B, of `N` forward passes (default 10,000: 2.8 GB each, 283
//! kB a pass, what SmolLM2's full traces take) with the real runtime, from a toy model
//! (`model.rs`) annotated like `examples/smollm/src/model.rs`: 30 `#[trace_layer]` blocks of
//! width 576 recording the five stages besides their input and output, `#[trace_attention]`
//! over 9 heads and every cached key, a `#[trace_kv_cache]` per layer, the seven
//! `#[trace_quant]` matmuls of a block and the Q8_0 head, `#[trace_logits]` over 49,152 tokens,
//! under a [`ModelTracerConfig::full`](model_trace::ModelTracerConfig::full) session. Pass 0 is
//! a 5-token prompt, every later pass one decoded token, so attention rows grow with the
//! position as in a real decode (past SmolLM2's 8,192-token context when `N` is above 8,188:
//! only the shapes go on growing). No matmul is computed: the values are cheap deterministic
//! pseudo-random draws with realistic scales, different in every pass, layer and site. B is A
//! with the last bit of every drawn value flipped (one ulp, ~1e-7 relative): no tensor of B is
//! bit-identical to A's, so `diff` compares every pair through its summaries and finds them
//! close, its most expensive case. `--diverge-at PASS` scales layer 15's `mlp_out` in that pass
//! of B by 1.01, so `diff` reports a divergence there (and must exit 1).
//!
//! Then it runs the `model-trace` binary of this package (cargo builds it for the bench; or
//! `--binary PATH`) on them, `--rounds` times (default 3) interleaved: `list A`, `summary A`,
//! `report A -o DIR/a.html` and `diff A B`, stdout to /dev/null, and measures each child's wall
//! time, CPU time and peak resident set (`ru_maxrss` from `wait4`, what `/usr/bin/time -v`
//! reports). The files are read from the page cache (they were just written), so the figures are
//! of parsing and matching, not of the disk. The CPU times say how much a busy machine slowed
//! the wall times down (`diff` reads its two files on two threads, so on an idle machine its CPU
//! time exceeds its wall time). Linux charges a process's peak resident set to the children it
//! starts afterwards, so the traces are written by a process of their own (this program with a
//! hidden `--generator`) and the measuring one stays at a few MiB, the floor of every figure.
//!
//! It prints the file sizes, the generator's speed, per command the median wall and CPU time,
//! its throughput (bytes of trace read per second: `|A|`, or `|A| + |B|` for `diff`) and its
//! largest peak RSS, and the two targets of issue 19: `peak RSS(diff) ≤ 256 MiB` and
//! `(|A| + |B|) / t_diff ≥ 0.8 · |A| / t_list(A)`, each PASS or MISS; `--json OUT` writes the
//! same figures. A missed target is a finding, not an error: the exit status is nonzero only
//! when something failed (a command's exit status, a file, the disk space).
//!
//! The files go to `--dir` (default a directory under the system's temporary directory, which
//! must have room for both: the bench says how much it needs before writing) and are deleted
//! at the end unless `--keep`. `--reuse` measures the A and B that an earlier `--keep` run left
//! in `--dir` with the same `--passes` and `--diverge-at` (generation takes minutes at 10,000
//! passes), and leaves them there.
//!
//! Under `cargo test` (which runs it without the `--bench` flag that `cargo bench` passes) the
//! defaults are a smoke run, `--passes 20 --rounds 1`, that checks everything works in seconds.

mod figures;
mod measure;
mod model;
mod traces;
mod usage;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};

use clap::Parser;
use model_trace::{RecordError, SessionError};

use crate::figures::Figures;
use crate::measure::measure;
use crate::traces::Traces;

/// Passes of a `cargo bench` run: 10,000 tokens, the issue's long run.
const BENCH_PASSES: usize = 10_000;
/// Rounds of a `cargo bench` run.
const BENCH_ROUNDS: usize = 3;
/// Passes of a `cargo test` run: a smoke run of a few seconds.
const SMOKE_PASSES: usize = 20;
/// Rounds of a `cargo test` run.
const SMOKE_ROUNDS: usize = 1;

/// Bytes of trace file per pass the space check counts on, a little above what the generator
/// writes (283 kB per pass at 10,000 passes, 280 kB at 1,000).
const BYTES_PER_PASS_BOUND: u64 = 300_000;
/// Room kept free besides the two traces: the report page, the commands' stderr.
const SPARE_BYTES: u64 = 256 << 20;

/// Issue 19's bound on `diff`'s peak resident set.
const DIFF_RSS_TARGET_BYTES: u64 = 256 << 20;
/// Issue 19's bound on `diff`'s throughput, as a fraction of `list`'s.
const DIFF_THROUGHPUT_TARGET: f64 = 0.8;

fn main() -> ExitCode {
    let options = Options::parse();
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("long_run: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The whole benchmark: settings, traces, measurements, figures.
fn run(options: &Options) -> Result<(), BenchError> {
    let settings = options.settings()?;
    if options.generator {
        return generate(&settings);
    }
    let traces = Traces::prepare(&settings)?;
    let reported = measure_and_report(&settings, &traces);
    // The traces go either way (gigabytes); a failed command's stderr stays for its error.
    let cleaned = traces.clean_up(reported.is_ok());
    reported.and(cleaned)
}

/// The generator's process: writes A and B, and says how long that took as JSON on stdout.
fn generate(settings: &Settings) -> Result<(), BenchError> {
    let traces = Traces::new(settings)?;
    let generation = traces.write_both(settings)?;
    let json = serde_json::to_string(&generation).map_err(BenchError::GeneratorOutput)?;
    println!("{json}");
    Ok(())
}

fn measure_and_report(settings: &Settings, traces: &Traces) -> Result<(), BenchError> {
    let measured = measure(settings, traces)?;
    let figures = Figures::new(settings, traces, &measured)?;
    print!("{figures}");
    match &settings.json {
        Some(path) => figures.write_json(path),
        None => Ok(()),
    }
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "long_run",
    about = "Time and peak memory of `model-trace` list, summary, report and diff on two long \
             full traces of a synthetic SmolLM2-135M decode"
)]
struct Options {
    /// Forward passes per trace [default: 10000; 20 under `cargo test`].
    #[arg(long, value_name = "N")]
    passes: Option<usize>,
    /// Times each command runs, interleaved; the table gives medians [default: 3; 1 under
    /// `cargo test`].
    #[arg(long, value_name = "R")]
    rounds: Option<usize>,
    /// Where the traces are written [default: a new directory in the temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Leave the traces (and the report page) in the directory.
    #[arg(long)]
    keep: bool,
    /// Measure the traces an earlier `--keep` run left in `--dir` (same --passes and
    /// --diverge-at) instead of writing them again; they are left there.
    #[arg(long, requires = "dir")]
    reuse: bool,
    /// Make B diverge from A in this pass (layer 15's `mlp_out`); `diff` must then exit 1.
    #[arg(long, value_name = "PASS")]
    diverge_at: Option<usize>,
    /// The `model-trace` binary to measure [default: this package's, built by cargo].
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Passed by `cargo bench`; without it (`cargo test`) the defaults are a smoke run.
    #[arg(long, hide = true)]
    bench: bool,
    /// Only write A and B to --dir and print how long that took: the process the bench
    /// starts to write them.
    #[arg(long, hide = true, requires = "dir")]
    generator: bool,
}

/// What one run does, the defaults filled in.
#[derive(Debug)]
struct Settings {
    passes: usize,
    rounds: usize,
    dir: Option<PathBuf>,
    keep: bool,
    reuse: bool,
    diverge_at: Option<usize>,
    binary: PathBuf,
    json: Option<PathBuf>,
}

impl Options {
    fn settings(&self) -> Result<Settings, BenchError> {
        let (passes, rounds) = if self.bench {
            (BENCH_PASSES, BENCH_ROUNDS)
        } else {
            (SMOKE_PASSES, SMOKE_ROUNDS)
        };
        let passes = self.passes.unwrap_or(passes);
        let rounds = self.rounds.unwrap_or(rounds);
        if passes == 0 || rounds == 0 {
            return Err(BenchError::Usage(
                "--passes and --rounds must be at least 1".into(),
            ));
        }
        if let Some(pass) = self.diverge_at.filter(|&pass| pass >= passes) {
            return Err(BenchError::Usage(format!(
                "--diverge-at {pass} is not one of the {passes} passes (0 to {})",
                passes - 1
            )));
        }
        Ok(Settings {
            passes,
            rounds,
            dir: self.dir.clone(),
            keep: self.keep,
            reuse: self.reuse,
            diverge_at: self.diverge_at,
            binary: self
                .binary
                .clone()
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_model-trace"))),
            json: self.json.clone(),
        })
    }
}

/// Why the benchmark could not measure.
#[derive(Debug)]
enum BenchError {
    /// Options that do not fit together.
    Usage(String),
    /// A file or directory operation failed.
    Io {
        what: String,
        path: PathBuf,
        source: io::Error,
    },
    /// The directory has too little free space for the traces.
    Space {
        dir: PathBuf,
        needed: u64,
        available: u64,
    },
    /// A trace session could not start.
    Session(SessionError),
    /// The session writes another file than the one asked for, or none.
    TraceFile {
        asked: PathBuf,
        got: Option<PathBuf>,
    },
    /// The generator's process failed (it said why on stderr).
    Generator(ExitStatus),
    /// The generator's process printed something else than its timings.
    GeneratorOutput(serde_json::Error),
    /// The runtime could not record something of the toy model.
    Record {
        path: PathBuf,
        errors: Vec<RecordError>,
    },
    /// A trace left by an earlier run is not the one asked for.
    Reuse { path: PathBuf, reason: String },
    /// A command exited with another status than expected.
    Command {
        command: String,
        status: ExitStatus,
        expected: i32,
        stderr: PathBuf,
        stderr_tail: String,
    },
}

impl BenchError {
    fn io(what: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let (what, path) = (what.into(), path.to_path_buf());
        move |source| Self::Io { what, path, source }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(message) => f.write_str(message),
            Self::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
            Self::Space {
                dir,
                needed,
                available,
            } => write!(
                f,
                "{} has {} free; the two traces need about {} (choose another with --dir, or \
                 fewer --passes)",
                dir.display(),
                megabytes(*available),
                megabytes(*needed)
            ),
            Self::Session(error) => write!(f, "cannot start the trace session: {error}"),
            Self::TraceFile { asked, got: None } => write!(
                f,
                "the session writes no trace file, not {} (is tracing compiled in?)",
                asked.display()
            ),
            Self::TraceFile {
                asked,
                got: Some(got),
            } => write!(
                f,
                "the session writes {}, not {}",
                got.display(),
                asked.display()
            ),
            Self::Generator(status) => write!(f, "the generator ended with {status}"),
            Self::GeneratorOutput(error) => write!(f, "the generator's timings: {error}"),
            Self::Record { path, errors } => {
                write!(f, "{} errors recording {}", errors.len(), path.display())?;
                match errors.first() {
                    Some(first) => write!(f, " (first: {first})"),
                    None => Ok(()),
                }
            }
            Self::Reuse { path, reason } => write!(
                f,
                "--reuse: {} {reason}; run once with --keep (without --reuse) to write it",
                path.display()
            ),
            Self::Command {
                command,
                status,
                expected,
                stderr,
                stderr_tail,
            } => write!(
                f,
                "`{command}` ended with {status}, expected exit status {expected}; its stderr \
                 ({}) ends:\n{stderr_tail}",
                stderr.display()
            ),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Session(error) => Some(error),
            Self::GeneratorOutput(error) => Some(error),
            _ => None,
        }
    }
}

/// `bytes` in MB (10⁶ bytes), for messages.
fn megabytes(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let mb = bytes as f64 / 1e6;
    format!("{mb:.0} MB")
}
