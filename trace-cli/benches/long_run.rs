//! Long runs through the `model-trace` command: how fast `list`, `summary`, `report` and `diff`
//! read two full traces of a long SmolLM2-135M decode, and how much memory each one takes.
//!
//! ```sh
//! cargo bench -p trace-cli --bench long_run -- [--passes N] [--rounds R] [--dir DIR] [--keep]
//!     [--reuse] [--diverge-at PASS] [--binary PATH] [--json OUT]
//! ```
//!
//! It writes two trace files, A and B, of `N` forward passes (default 10,000: about 2.7 GB
//! each) with the real runtime: a toy model annotated like `examples/smollm/src/model.rs` (30
//! `#[trace_layer]` blocks of width 576 recording the five stages besides their input and
//! output, `#[trace_attention]` over 9 heads and every cached key, a `#[trace_kv_cache]` per
//! layer, the seven `#[trace_quant]` matmuls of a block and the Q8_0 head, `#[trace_logits]` over
//! 49,152 tokens) under a [`ModelTracerConfig::full`] session. Pass 0 is a 5-token prompt, every
//! later pass one decoded token, so attention rows grow with the position as in a real decode
//! (past SmolLM2's 8,192-token context when `N` is above 8,188: only the shapes go on growing).
//! No matmul is computed: the values are cheap deterministic pseudo-random draws with
//! realistic scales (the residual stream adds up, norms normalise, attention rows put their
//! weight on a sink, the recent keys and a few others), different in every pass, layer and site.
//! B is A with the last bit of every drawn value flipped (one ulp, ~1e-7 relative): no tensor
//! of B is bit-identical to A's, so `diff` compares every pair through its summaries and finds
//! them close, its most expensive case. `--diverge-at PASS` scales layer 15's `mlp_out` in that
//! pass of B by 1.01, so `diff` reports a divergence there (and must exit 1).
//!
//! Then it runs the `model-trace` binary of this package (cargo builds it for the bench; or
//! `--binary PATH`) on them, `--rounds` times (default 3) interleaved: `list A`, `summary A`,
//! `report A -o DIR/a.html` and `diff A B`, stdout to /dev/null, and measures each child's wall
//! time and peak resident set (`ru_maxrss` from `wait4`, what `/usr/bin/time -v` reports). The
//! files are read from the page cache after the first round (they were just written), so the
//! figures are of parsing and matching, not of the disk.
//!
//! It prints the file sizes, the generator's speed, per command the median time, its
//! throughput (bytes of trace read per second: `|A|`, or `|A| + |B|` for `diff`) and its largest
//! peak RSS, and the two targets of issue 19: `peak RSS(diff) ≤ 256 MiB` and
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

use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use model_trace::{
    trace_attention, trace_kv_cache, trace_layer, trace_logits, trace_model, trace_quant,
    trace_tensor, ModelTracerConfig, RecordError, Session, SessionError, TensorError, TraceReader,
    TraceTensor,
};
use serde::Serialize;

/// Passes of a `cargo bench` run: 10,000 tokens, the issue's long run.
const BENCH_PASSES: usize = 10_000;
/// Rounds of a `cargo bench` run.
const BENCH_ROUNDS: usize = 3;
/// Passes of a `cargo test` run: a smoke run of a few seconds.
const SMOKE_PASSES: usize = 20;
/// Rounds of a `cargo test` run.
const SMOKE_ROUNDS: usize = 1;

/// Bytes of trace file per pass the space check counts on, a little above what the generator
/// writes (~271 kB per pass measured at 10,000 passes).
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
    let traces = Traces::prepare(&settings)?;
    let reported = measure_and_report(&settings, &traces);
    // The traces go either way (gigabytes); a failed command's stderr stays for its error.
    let cleaned = traces.clean_up(reported.is_ok());
    reported.and(cleaned)
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

// ---------------------------------------------------------------------------------------------
// The traces: written by the runtime from a toy SmolLM2-135M.

/// The two trace files and what writing them took.
#[derive(Debug)]
struct Traces {
    dir: PathBuf,
    /// Whether this run made `dir` (and so removes it when it is left empty).
    made_dir: bool,
    reference: PathBuf,
    perturbed: PathBuf,
    report: PathBuf,
    /// `None` when reused.
    generation: Option<Generation>,
    /// Whether the traces and the report are removed at the end.
    remove: bool,
}

/// How long the generator took.
#[derive(Debug, Clone, Copy)]
struct Generation {
    /// Both files, written at once on two threads.
    wall: Duration,
    /// Each file by itself.
    reference: Duration,
    perturbed: Duration,
}

impl Traces {
    /// Writes A and B (or finds them, with `--reuse`) in the chosen directory.
    fn prepare(settings: &Settings) -> Result<Self, BenchError> {
        let (dir, made_dir) = match &settings.dir {
            Some(dir) => (dir.clone(), !dir.exists()),
            None => (
                std::env::temp_dir().join(format!("model-trace-long-run-{}", std::process::id())),
                true,
            ),
        };
        std::fs::create_dir_all(&dir).map_err(BenchError::io("create", &dir))?;
        let mut traces = Self {
            reference: dir.join("a.ndjson"),
            perturbed: dir.join("b.ndjson"),
            report: dir.join("a.html"),
            dir,
            made_dir,
            generation: None,
            remove: !settings.keep && !settings.reuse,
        };
        if settings.reuse {
            check_reusable(&traces.reference, Variant::Reference, settings)?;
            let perturbed = Variant::Perturbed {
                diverge_at: settings.diverge_at,
            };
            check_reusable(&traces.perturbed, perturbed, settings)?;
            return Ok(traces);
        }
        check_space(&traces.dir, settings.passes)?;
        eprintln!(
            "long_run: writing two traces of {} passes to {} ...",
            settings.passes,
            traces.dir.display()
        );
        // From here on the files are ours: removed on error too, unless --keep.
        let generation = traces.generate(settings);
        match generation {
            Ok(generation) => traces.generation = Some(generation),
            Err(error) => {
                let _ = traces.clean_up(true);
                return Err(error);
            }
        }
        Ok(traces)
    }

    /// A and B at once, one session on each of two threads.
    fn generate(&self, settings: &Settings) -> Result<Generation, BenchError> {
        let started = Instant::now();
        let perturbed = Variant::Perturbed {
            diverge_at: settings.diverge_at,
        };
        let (reference, perturbed) = std::thread::scope(|scope| {
            let reference =
                scope.spawn(|| write_trace(&self.reference, Variant::Reference, settings.passes));
            let perturbed = write_trace(&self.perturbed, perturbed, settings.passes);
            let reference = reference.join().unwrap_or_else(|panic| {
                std::panic::resume_unwind(panic);
            });
            (reference, perturbed)
        });
        Ok(Generation {
            wall: started.elapsed(),
            reference: reference?,
            perturbed: perturbed?,
        })
    }

    fn size(path: &Path) -> Result<u64, BenchError> {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(BenchError::io("read the size of", path))
    }

    /// Removes the traces and the report unless they are to be kept, and the commands'
    /// stderr files when `succeeded` (after a failure they hold its cause).
    fn clean_up(&self, succeeded: bool) -> Result<(), BenchError> {
        if succeeded {
            for subject in Subject::ALL {
                let _ = std::fs::remove_file(self.dir.join(subject.stderr_file()));
            }
        }
        if !self.remove {
            eprintln!("long_run: the traces are in {}", self.dir.display());
            return Ok(());
        }
        for path in [&self.reference, &self.perturbed, &self.report] {
            match std::fs::remove_file(path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    return Err(BenchError::io("remove", path)(error));
                }
                _ => {}
            }
        }
        if self.made_dir && succeeded {
            // Left where something else was put in it meanwhile.
            let _ = std::fs::remove_dir(&self.dir);
        }
        Ok(())
    }
}

/// Fails unless `dir` has room for two traces of `passes` passes.
fn check_space(dir: &Path, passes: usize) -> Result<(), BenchError> {
    let needed = 2 * BYTES_PER_PASS_BOUND * passes as u64 + SPARE_BYTES;
    let available = free_space(dir).map_err(BenchError::io("read the free space of", dir))?;
    eprintln!(
        "long_run: the traces need about {}; {} has {} free",
        megabytes(needed),
        dir.display(),
        megabytes(available)
    );
    if available < needed {
        return Err(BenchError::Space {
            dir: dir.to_path_buf(),
            needed,
            available,
        });
    }
    Ok(())
}

/// Bytes an unprivileged process can still write in the file system of `dir`.
fn free_space(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    // SAFETY: `statvfs` is plain data, for which all zeroes is a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stats` a valid place for the result; both
    // outlive the call, which keeps neither pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    Ok(u64::from(stats.f_bavail) * u64::from(stats.f_frsize))
}

/// The `metadata.extra` keys through which a trace says how it was generated, for `--reuse`.
const EXTRA_PASSES: &str = "long_run.passes";
const EXTRA_VARIANT: &str = "long_run.variant";

/// Fails unless `path` is a complete trace written by this bench as `variant` of `passes`.
fn check_reusable(path: &Path, variant: Variant, settings: &Settings) -> Result<(), BenchError> {
    let reject = |reason: String| BenchError::Reuse {
        path: path.to_path_buf(),
        reason,
    };
    let reader =
        TraceReader::open(path).map_err(|error| reject(format!("is unreadable: {error}")))?;
    let extra = &reader.header().metadata.extra;
    let said = |key: &str| extra.get(key).map_or("nothing", String::as_str).to_owned();
    let (passes, written_as) = (said(EXTRA_PASSES), said(EXTRA_VARIANT));
    if passes != settings.passes.to_string() || written_as != variant.to_string() {
        return Err(reject(format!(
            "was written with {passes} passes as {written_as}, not {} passes as {variant}",
            settings.passes
        )));
    }
    if !ends_with_session_end(path).map_err(|error| reject(format!("is unreadable: {error}")))? {
        return Err(reject("was cut short (no session_end at its end)".into()));
    }
    Ok(())
}

/// Whether the last line of `path` is a `session_end` event.
fn ends_with_session_end(path: &Path) -> io::Result<bool> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(64 << 10)))?;
    let mut end = Vec::new();
    file.read_to_end(&mut end)?;
    let last = end
        .strip_suffix(b"\n")
        .unwrap_or(&end)
        .rsplit(|&byte| byte == b'\n')
        .next()
        .unwrap_or_default();
    Ok(last.starts_with(br#"{"event":"session_end""#))
}

/// Runs the toy model for `passes` passes under a full session writing `path`.
fn write_trace(path: &Path, variant: Variant, passes: usize) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(path)
        .model("SmolLM2-135M-Instruct (synthetic: trace-cli's long_run bench)")
        .prompt(format!(
            "{PROMPT_TOKENS} tokens, then {} decoded",
            passes - 1
        ))
        .extra(EXTRA_PASSES, passes.to_string())
        .extra(EXTRA_VARIANT, variant.to_string())
        .start()
        .map_err(BenchError::Session)?;
    if session.trace_file() != Some(path) {
        return Err(BenchError::TraceFile {
            asked: path.to_path_buf(),
            got: session.trace_file().map(Path::to_path_buf),
        });
    }
    let mut model = Model::new();
    for pass in 0..passes {
        let (tokens, position) = match pass {
            0 => (PROMPT_TOKENS, 0),
            _ => (1, PROMPT_TOKENS + pass - 1),
        };
        model.forward(tokens, position, Step { pass, variant });
    }
    let (_, errors) = session.finish_with_errors();
    if !errors.is_empty() {
        return Err(BenchError::Record {
            path: path.to_path_buf(),
            errors,
        });
    }
    Ok(started.elapsed())
}

/// SmolLM2-135M's shape.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTERMEDIATE: usize = 1536;
const VOCAB: usize = 49_152;
/// Tokens of the prompt, run in pass 0 ("The capital of France is").
const PROMPT_TOKENS: usize = 5;
/// The layer whose `mlp_out` `--diverge-at` changes.
const DIVERGING_LAYER: usize = LAYERS / 2;

/// Which of the two traces a run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// A: the values as drawn.
    Reference,
    /// B: every drawn value one ulp off A's; optionally a real divergence in one pass.
    Perturbed { diverge_at: Option<usize> },
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reference => f.write_str("reference"),
            Self::Perturbed { diverge_at: None } => f.write_str("perturbed"),
            Self::Perturbed {
                diverge_at: Some(pass),
            } => write!(f, "perturbed, diverging at pass {pass}"),
        }
    }
}

/// The pass being computed and the trace it is for: everything a draw depends on.
#[derive(Debug, Clone, Copy)]
struct Step {
    pass: usize,
    variant: Variant,
}

/// Where in the model values are drawn, so that each site draws its own.
#[derive(Debug, Clone, Copy)]
enum Site {
    Embedding,
    Query,
    Key,
    Value,
    AttentionOutput,
    Gate,
    Up,
    Down,
    Head,
    Attention,
}

impl Step {
    /// `count` values drawn for `site` of `layer` in this pass, spread over `±scale`
    /// (triangular, std 0.41·scale), perturbed for B.
    fn draw(self, site: Site, layer: usize, count: usize, scale: f32) -> Vec<f32> {
        let mut draws = Draws::new(self.pass, layer, site as u64);
        let mut values: Vec<f32> = (0..count).map(|_| draws.symmetric() * scale).collect();
        self.perturb(&mut values);
        values
    }

    /// B's values flip the last bit of A's: one ulp, never bit-identical, always close.
    fn perturb(self, values: &mut [f32]) {
        if let Variant::Perturbed { .. } = self.variant {
            for value in values {
                *value = f32::from_bits(value.to_bits() ^ 1);
            }
        }
    }

    /// Whether B's `layer` diverges from A's in this pass.
    fn diverges(self, layer: usize) -> bool {
        matches!(self.variant, Variant::Perturbed { diverge_at: Some(pass) } if pass == self.pass)
            && layer == DIVERGING_LAYER
    }
}

/// xorshift64: fast, and enough for values that only need to differ.
struct Draws(u64);

impl Draws {
    fn new(pass: usize, layer: usize, site: u64) -> Self {
        let seed = (pass as u64) << 24 | (layer as u64) << 8 | site;
        Self(splitmix64(seed) | 1)
    }

    fn next_bits(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// In `[0, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next_bits() >> 40) as f32 * (1.0 / 16_777_216.0)
    }

    /// In `(-1, 1)`, triangular: the sum of two 24-bit uniforms of one draw.
    fn symmetric(&mut self) -> f32 {
        let bits = self.next_bits();
        let (high, low) = ((bits >> 40) as f32, ((bits >> 16) & 0xFF_FFFF) as f32);
        (high + low) * (1.0 / 16_777_216.0) - 1.0
    }
}

/// Spreads a structured seed over all 64 bits.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The toy model's tensors: a shape and `f32` values, row-major.
#[derive(Debug, Clone)]
struct Tensor {
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl TraceTensor for Tensor {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(&self.values))
    }
}

impl Tensor {
    /// `[.., width]` with the same leading dimensions as `self`.
    fn shape_with_width(&self, width: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = width;
        }
        shape
    }

    /// Rows of the last dimension.
    fn rows(&self) -> usize {
        self.shape[..self.shape.len() - 1].iter().product()
    }

    fn add(&self, other: &Self) -> Self {
        Self {
            shape: self.shape.clone(),
            values: self
                .values
                .iter()
                .zip(&other.values)
                .map(|(a, b)| a + b)
                .collect(),
        }
    }

    /// RMS norm of each row (unit weights).
    fn rms_norm(&self) -> Self {
        let width = self.shape.last().copied().unwrap_or(1);
        let mut values = Vec::with_capacity(self.values.len());
        for row in self.values.chunks(width) {
            let mean_square = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
            let scale = 1.0 / (mean_square + 1e-5).sqrt();
            values.extend(row.iter().map(|v| v * scale));
        }
        Self {
            shape: self.shape.clone(),
            values,
        }
    }

    /// The last position of `[batch, seq, hidden]`, as `[batch, hidden]`.
    fn last_position(&self) -> Self {
        let width = self.shape[2];
        Self {
            shape: vec![self.shape[0], width],
            values: self.values[self.values.len() - width..].to_vec(),
        }
    }
}

/// The quantization formats of SmolLM2's GGUF: Q4_1 blocks, a Q8_0 head.
#[derive(Debug, Clone, Copy)]
enum Format {
    Q4_1,
    Q8_0,
}

/// A quantized matmul `[.., in] -> [.., out]`: its output drawn, its f32 reference drawn the
/// same and off by this format's quantization error.
struct QuantLinear {
    format: Format,
    site: Site,
    layer: usize,
    out: usize,
    scale: f32,
}

impl QuantLinear {
    fn new(format: Format, site: Site, layer: usize, out: usize, scale: f32) -> Self {
        Self {
            format,
            site,
            layer,
            out,
            scale,
        }
    }

    /// As `examples/smollm`'s: one traced site per format, so each record has its format.
    fn forward(&self, x: &Tensor, step: Step) -> Tensor {
        match self.format {
            Format::Q4_1 => self.forward_q4_1(x, step),
            Format::Q8_0 => self.forward_q8_0(x, step),
        }
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q4_1, name = "q4_1_matmul")]
    fn forward_q4_1(&self, x: &Tensor, step: Step) -> Tensor {
        self.quantized(x, step, 0.05)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q8_0, name = "q8_0_matmul")]
    fn forward_q8_0(&self, x: &Tensor, step: Step) -> Tensor {
        self.quantized(x, step, 0.005)
    }

    /// The reference: what the matmul would give on the dequantized f32 weights.
    fn forward_f32(&self, x: &Tensor, step: Step) -> Tensor {
        let count = x.rows() * self.out;
        Tensor {
            shape: x.shape_with_width(self.out),
            values: step.draw(self.site, self.layer, count, self.scale),
        }
    }

    /// The reference plus an error of `relative_error` of its scale.
    fn quantized(&self, x: &Tensor, step: Step, relative_error: f32) -> Tensor {
        let mut output = self.forward_f32(x, step);
        let mut error = Draws::new(step.pass, self.layer, self.site as u64 | 0x80);
        let error_scale = self.scale * relative_error;
        for value in &mut output.values {
            *value += error.symmetric() * error_scale;
        }
        output
    }
}

/// One layer's KV cache: only its bookkeeping, doubling its capacity as SmolLM2's does.
struct KvCache {
    len: usize,
    capacity: usize,
}

impl KvCache {
    const INITIAL_CAPACITY: usize = 64;

    /// Bytes of keys and values the capacity holds.
    fn bytes(&self) -> usize {
        2 * self.capacity * KV_HEADS * HEAD_DIM * std::mem::size_of::<f32>()
    }

    /// Caches `new` positions; returns how many keys attention sees now.
    #[trace_kv_cache(len = self.len, capacity = self.capacity, bytes = self.bytes())]
    fn append(&mut self, new: usize) -> usize {
        self.len += new;
        if self.len > self.capacity {
            self.capacity = self.len.max(Self::INITIAL_CAPACITY).max(self.capacity * 2);
        }
        self.len
    }
}

struct Attention {
    layer: usize,
    q: QuantLinear,
    k: QuantLinear,
    v: QuantLinear,
    o: QuantLinear,
}

impl Attention {
    fn new(layer: usize) -> Self {
        let kv_width = KV_HEADS * HEAD_DIM;
        Self {
            layer,
            q: QuantLinear::new(Format::Q4_1, Site::Query, layer, HIDDEN, 2.0),
            k: QuantLinear::new(Format::Q4_1, Site::Key, layer, kv_width, 2.0),
            v: QuantLinear::new(Format::Q4_1, Site::Value, layer, kv_width, 1.0),
            o: QuantLinear::new(
                Format::Q4_1,
                Site::AttentionOutput,
                layer,
                HIDDEN,
                0.1 + 0.01 * layer as f32,
            ),
        }
    }

    /// `x: [1, seq, hidden]` at `position` -> `[1, seq, hidden]`.
    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache, step: Step) -> Tensor {
        let queries = self.q.forward(x, step);
        let _keys = self.k.forward(x, step);
        let _values = self.v.forward(x, step);
        let k_len = cache.append(x.shape[1]);
        let _probs = self.attention_probs(&queries, k_len, position, step);
        self.o.forward(x, step)
    }

    /// Causal probabilities `[1, heads, q_len, k_len]`: each row puts ~35% on the sink (key 0),
    /// ~15% on the last three keys, ~20% on four others and the rest spread over all it sees.
    #[trace_attention]
    fn attention_probs(
        &self,
        queries: &Tensor,
        k_len: usize,
        position: usize,
        step: Step,
    ) -> Tensor {
        let q_len = queries.shape[1];
        let mut draws = Draws::new(step.pass, self.layer, Site::Attention as u64);
        let mut values = vec![0.0f32; HEADS * q_len * k_len];
        for (index, row) in values.chunks_mut(k_len).enumerate() {
            let visible = (position + index % q_len + 1).min(k_len);
            attention_row(&mut row[..visible], &mut draws);
        }
        step.perturb(&mut values);
        Tensor {
            shape: vec![1, HEADS, q_len, k_len],
            values,
        }
    }
}

/// Fills one row of attention weights over the keys it sees, summing to 1.
fn attention_row(row: &mut [f32], draws: &mut Draws) {
    let keys = row.len();
    for weight in row.iter_mut() {
        *weight = draws.unit();
    }
    let spread: f32 = row.iter().sum();
    let spread_scale = 0.3 / spread.max(f32::MIN_POSITIVE);
    for weight in row.iter_mut() {
        *weight *= spread_scale;
    }
    row[0] += 0.3 + 0.1 * draws.unit();
    for back in 1..=3.min(keys) {
        row[keys - back] += 0.03 + 0.04 * draws.unit();
    }
    for _ in 0..4 {
        let key = (draws.next_bits() % keys as u64) as usize;
        row[key] += 0.03 + 0.04 * draws.unit();
    }
    let total: f32 = row.iter().sum();
    for weight in row.iter_mut() {
        *weight /= total;
    }
}

struct Mlp {
    layer: usize,
    gate: QuantLinear,
    up: QuantLinear,
    down: QuantLinear,
}

impl Mlp {
    fn new(layer: usize) -> Self {
        Self {
            layer,
            gate: QuantLinear::new(Format::Q4_1, Site::Gate, layer, INTERMEDIATE, 2.0),
            up: QuantLinear::new(Format::Q4_1, Site::Up, layer, INTERMEDIATE, 2.0),
            down: QuantLinear::new(
                Format::Q4_1,
                Site::Down,
                layer,
                HIDDEN,
                0.2 + 0.02 * layer as f32,
            ),
        }
    }

    fn forward(&self, x: &Tensor, step: Step) -> Tensor {
        let gate = self.gate.forward(x, step);
        let _up = self.up.forward(x, step);
        let mut out = self.down.forward(&gate, step);
        if step.diverges(self.layer) {
            out.values.iter_mut().for_each(|value| *value *= 1.01);
        }
        out
    }
}

struct Block {
    attention: Attention,
    mlp: Mlp,
}

impl Block {
    /// One pre-norm block over `x: [1, seq, hidden]`, its stages recorded as SmolLM2's are.
    #[trace_layer]
    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache, step: Step) -> Tensor {
        let attn_in = x.rms_norm();
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attention.forward(&attn_in, position, cache, step);
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = x.add(&attn_out);
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = resid_mid.rms_norm();
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = self.mlp.forward(&mlp_in, step);
        trace_tensor!("mlp_out", &mlp_out);
        resid_mid.add(&mlp_out)
    }
}

/// SmolLM2-135M's structure with drawn values.
struct Model {
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    head: QuantLinear,
}

impl Model {
    fn new() -> Self {
        Self {
            blocks: (0..LAYERS)
                .map(|layer| Block {
                    attention: Attention::new(layer),
                    mlp: Mlp::new(layer),
                })
                .collect(),
            caches: (0..LAYERS)
                .map(|_| KvCache {
                    len: 0,
                    capacity: 0,
                })
                .collect(),
            head: QuantLinear::new(Format::Q8_0, Site::Head, LAYERS, VOCAB, 12.0),
        }
    }

    /// `tokens` tokens from `position` on -> the next token's logits `[1, vocab]`.
    #[trace_model(position = position)]
    fn forward(&mut self, tokens: usize, position: usize, step: Step) -> Tensor {
        let mut x = Tensor {
            shape: vec![1, tokens, HIDDEN],
            values: step.draw(Site::Embedding, 0, tokens * HIDDEN, 0.1),
        };
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            x = block.forward(&x, position, cache, step);
        }
        self.logits(&x.last_position(), step)
    }

    /// The final norm and the head: `[1, hidden] -> [1, vocab]`.
    #[trace_logits]
    fn logits(&self, hidden: &Tensor, step: Step) -> Tensor {
        self.head.forward(&hidden.rms_norm(), step)
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring the commands.

/// One command of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    List,
    Summary,
    Report,
    Diff,
}

impl Subject {
    const ALL: [Self; 4] = [Self::List, Self::Summary, Self::Report, Self::Diff];

    fn label(self) -> &'static str {
        match self {
            Self::List => "list A",
            Self::Summary => "summary A",
            Self::Report => "report A",
            Self::Diff => "diff A B",
        }
    }

    fn arguments(self, traces: &Traces) -> Vec<OsString> {
        let a = traces.reference.as_os_str().to_owned();
        match self {
            Self::List => vec!["list".into(), a],
            Self::Summary => vec!["summary".into(), a],
            Self::Report => vec![
                "report".into(),
                a,
                "-o".into(),
                traces.report.as_os_str().to_owned(),
            ],
            Self::Diff => vec!["diff".into(), a, traces.perturbed.as_os_str().to_owned()],
        }
    }

    /// Where the command's stderr goes, in the traces' directory.
    fn stderr_file(self) -> &'static str {
        match self {
            Self::List => "list.stderr",
            Self::Summary => "summary.stderr",
            Self::Report => "report.stderr",
            Self::Diff => "diff.stderr",
        }
    }

    /// The exit status that says the command did what was measured.
    fn expected_status(self, settings: &Settings) -> i32 {
        match (self, settings.diverge_at) {
            (Self::Diff, Some(_)) => 1,
            _ => 0,
        }
    }
}

/// One run of a command: how long it took and its peak resident set.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    peak_rss_bytes: u64,
}

/// Every sample of every command, in [`Subject::ALL`] order.
#[derive(Debug)]
struct Measured {
    samples: Vec<(Subject, Vec<Sample>)>,
}

/// Runs each command `rounds` times, interleaved.
fn measure(settings: &Settings, traces: &Traces) -> Result<Measured, BenchError> {
    let mut samples: Vec<(Subject, Vec<Sample>)> = Subject::ALL
        .iter()
        .map(|&subject| (subject, Vec::new()))
        .collect();
    for round in 1..=settings.rounds {
        for (subject, samples) in &mut samples {
            let stderr = traces.dir.join(subject.stderr_file());
            let sample = run_child(settings, traces, *subject, &stderr)?;
            eprintln!(
                "long_run: round {round}/{}: {:<9}  {:>8.2} s  {:>8.1} MiB",
                settings.rounds,
                subject.label(),
                sample.wall.as_secs_f64(),
                mebibytes(sample.peak_rss_bytes)
            );
            samples.push(sample);
        }
    }
    Ok(Measured { samples })
}

/// Runs one command, stdout to /dev/null and stderr to `stderr`, and checks its exit status.
fn run_child(
    settings: &Settings,
    traces: &Traces,
    subject: Subject,
    stderr: &Path,
) -> Result<Sample, BenchError> {
    let stderr_file = File::create(stderr).map_err(BenchError::io("create", stderr))?;
    let arguments = subject.arguments(traces);
    let started = Instant::now();
    let child = Command::new(&settings.binary)
        .args(&arguments)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr_file)
        .spawn()
        .map_err(BenchError::io("run", &settings.binary))?;
    let (status, peak_rss_bytes) =
        wait_for_peak_rss(child.id()).map_err(BenchError::io("wait for", &settings.binary))?;
    let wall = started.elapsed();
    let expected = subject.expected_status(settings);
    if status.code() != Some(expected) {
        let command = std::iter::once(settings.binary.as_os_str())
            .chain(arguments.iter().map(OsString::as_os_str))
            .map(|part| part.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        return Err(BenchError::Command {
            command,
            status,
            expected,
            stderr: stderr.to_path_buf(),
            stderr_tail: tail(stderr),
        });
    }
    Ok(Sample {
        wall,
        peak_rss_bytes,
    })
}

/// Waits for the child `pid` and returns its exit status and peak resident set in bytes.
///
/// `wait4`, not `Child::wait`: only the call that reaps the child gets its resource usage.
fn wait_for_peak_rss(pid: u32) -> io::Result<(ExitStatus, u64)> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain data, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid places for the results and outlive the call,
        // which keeps neither pointer; `pid` is our own child, not yet reaped.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    // Linux counts `ru_maxrss` in KiB, macOS in bytes.
    let unit = if cfg!(target_os = "macos") { 1 } else { 1024 };
    let peak = u64::try_from(usage.ru_maxrss).unwrap_or(0) * unit;
    Ok((ExitStatus::from_raw(status), peak))
}

/// The last lines of a command's stderr, for an error message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let shown = &lines[lines.len().saturating_sub(20)..];
    if shown.is_empty() {
        return "  (nothing)".into();
    }
    shown.iter().map(|line| format!("  {line}\n")).collect()
}

#[allow(clippy::cast_precision_loss)]
fn mebibytes(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

// ---------------------------------------------------------------------------------------------
// The figures.

/// What the run measured, as printed and as `--json` writes it.
#[derive(Debug, Serialize)]
struct Figures {
    passes: usize,
    rounds: usize,
    binary: PathBuf,
    diverge_at: Option<usize>,
    traces: TraceFigures,
    /// `None` when the traces were reused.
    generation: Option<GenerationFigures>,
    commands: Vec<CommandFigures>,
    targets: Vec<Target>,
}

#[derive(Debug, Serialize)]
struct TraceFigures {
    a: PathBuf,
    a_bytes: u64,
    b: PathBuf,
    b_bytes: u64,
    /// `|A| / passes`.
    bytes_per_pass: f64,
}

#[derive(Debug, Serialize)]
struct GenerationFigures {
    /// A and B written at once, on two threads.
    wall_seconds: f64,
    a_seconds: f64,
    b_seconds: f64,
    /// Passes per second of one trace (A's).
    passes_per_second: f64,
    /// Bytes per second of one trace (A's).
    bytes_per_second: f64,
}

#[derive(Debug, Serialize)]
struct CommandFigures {
    command: &'static str,
    /// Each round's wall time.
    seconds: Vec<f64>,
    median_seconds: f64,
    /// Bytes read (`|A|`, `|A| + |B|` for diff) over the median time.
    bytes_per_second: f64,
    /// The largest of the rounds' peak resident sets.
    peak_rss_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Target {
    /// What is bounded.
    name: &'static str,
    unit: &'static str,
    value: f64,
    bound: f64,
    /// `≤` or `≥`.
    relation: &'static str,
    met: bool,
}

impl Figures {
    fn new(settings: &Settings, traces: &Traces, measured: &Measured) -> Result<Self, BenchError> {
        let a_bytes = Traces::size(&traces.reference)?;
        let b_bytes = Traces::size(&traces.perturbed)?;
        #[allow(clippy::cast_precision_loss)]
        let (a, both) = (a_bytes as f64, (a_bytes + b_bytes) as f64);
        let commands: Vec<CommandFigures> = measured
            .samples
            .iter()
            .map(|(subject, samples)| {
                let seconds: Vec<f64> = samples.iter().map(|s| s.wall.as_secs_f64()).collect();
                let median_seconds = median(&seconds);
                let read = if *subject == Subject::Diff { both } else { a };
                CommandFigures {
                    command: subject.label(),
                    seconds,
                    median_seconds,
                    bytes_per_second: read / median_seconds,
                    peak_rss_bytes: samples.iter().map(|s| s.peak_rss_bytes).max().unwrap_or(0),
                }
            })
            .collect();
        let targets = targets(&commands);
        #[allow(clippy::cast_precision_loss)]
        let passes = settings.passes as f64;
        Ok(Self {
            passes: settings.passes,
            rounds: settings.rounds,
            binary: settings.binary.clone(),
            diverge_at: settings.diverge_at,
            traces: TraceFigures {
                a: traces.reference.clone(),
                a_bytes,
                b: traces.perturbed.clone(),
                b_bytes,
                bytes_per_pass: a / passes,
            },
            generation: traces.generation.map(|generation| GenerationFigures {
                wall_seconds: generation.wall.as_secs_f64(),
                a_seconds: generation.reference.as_secs_f64(),
                b_seconds: generation.perturbed.as_secs_f64(),
                passes_per_second: passes / generation.reference.as_secs_f64(),
                bytes_per_second: a / generation.reference.as_secs_f64(),
            }),
            commands,
            targets,
        })
    }

    fn write_json(&self, path: &Path) -> Result<(), BenchError> {
        let file = File::create(path).map_err(BenchError::io("create", path))?;
        serde_json::to_writer_pretty(io::BufWriter::new(file), self)
            .map_err(|error| BenchError::io("write", path)(error.into()))
    }

    fn command(&self, label: &str) -> Option<&CommandFigures> {
        self.commands.iter().find(|c| c.command == label)
    }
}

/// Issue 19's two targets for `diff`.
fn targets(commands: &[CommandFigures]) -> Vec<Target> {
    let find = |subject: Subject| commands.iter().find(|c| c.command == subject.label());
    let (Some(list), Some(diff)) = (find(Subject::List), find(Subject::Diff)) else {
        return Vec::new();
    };
    #[allow(clippy::cast_precision_loss)]
    let rss = diff.peak_rss_bytes as f64;
    #[allow(clippy::cast_precision_loss)]
    let rss_bound = DIFF_RSS_TARGET_BYTES as f64;
    let throughput_bound = DIFF_THROUGHPUT_TARGET * list.bytes_per_second;
    vec![
        Target {
            name: "peak RSS of diff A B",
            unit: "bytes",
            value: rss,
            bound: rss_bound,
            relation: "<=",
            met: rss <= rss_bound,
        },
        Target {
            name: "diff's throughput (|A|+|B|)/t_diff, against 0.8·|A|/t_list(A)",
            unit: "bytes per second",
            value: diff.bytes_per_second,
            bound: throughput_bound,
            relation: ">=",
            met: diff.bytes_per_second >= throughput_bound,
        },
    ]
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `bytes` in MB with three significant digits at most sizes.
fn size(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} kB", b / 1e3),
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let diverging = match self.diverge_at {
            Some(pass) => format!(", B diverging at pass {pass}"),
            None => String::new(),
        };
        writeln!(
            f,
            "model-trace on two full traces of {} passes of a synthetic SmolLM2-135M decode{diverging}",
            self.passes
        )?;
        writeln!(f, "binary: {}", self.binary.display())?;
        let traces = &self.traces;
        #[allow(clippy::cast_precision_loss)]
        let (a_bytes, b_bytes) = (traces.a_bytes as f64, traces.b_bytes as f64);
        writeln!(
            f,
            "A: {} ({}), B: {} ({}); {} per pass",
            traces.a.display(),
            size(a_bytes),
            traces.b.display(),
            size(b_bytes),
            size(traces.bytes_per_pass)
        )?;
        match &self.generation {
            Some(generation) => writeln!(
                f,
                "generated in {:.1} s, A and B at once on two threads (A alone {:.1} s: {:.0} \
                 passes/s, {:.0} MB/s)",
                generation.wall_seconds,
                generation.a_seconds,
                generation.passes_per_second,
                generation.bytes_per_second / 1e6
            )?,
            None => writeln!(f, "traces reused from an earlier run")?,
        }
        writeln!(
            f,
            "\n{:<10} {:>14} {:>10} {:>14}   ({} round{}, page cache warm)",
            "command",
            "median time",
            "MB/s",
            "peak RSS",
            self.rounds,
            if self.rounds == 1 { "" } else { "s" }
        )?;
        for command in &self.commands {
            writeln!(
                f,
                "{:<10} {:>12.2} s {:>10.0} {:>10.1} MiB",
                command.command,
                command.median_seconds,
                command.bytes_per_second / 1e6,
                mebibytes(command.peak_rss_bytes)
            )?;
        }
        writeln!(f, "\ntargets (issue 19):")?;
        let verdict = |met: bool| if met { "PASS" } else { "MISS" };
        if let [rss, throughput] = self.targets.as_slice() {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let (value, bound) = (rss.value as u64, rss.bound as u64);
            writeln!(
                f,
                "  peak RSS(diff) <= {:.0} MiB: {:.1} MiB  {}",
                mebibytes(bound),
                mebibytes(value),
                verdict(rss.met)
            )?;
            let list = self.command(Subject::List.label());
            writeln!(
                f,
                "  (|A|+|B|)/t_diff >= 0.8·|A|/t_list(A): {:.0} MB/s against 0.8 x {:.0} = {:.0} \
                 MB/s  {}",
                throughput.value / 1e6,
                list.map_or(f64::NAN, |list| list.bytes_per_second / 1e6),
                throughput.bound / 1e6,
                verdict(throughput.met)
            )?;
        }
        Ok(())
    }
}
