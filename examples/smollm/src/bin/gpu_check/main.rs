//! `gpu_check`: model-trace on a GPU, checked by a program that needs no cargo where it runs.
//!
//! ```sh
//! cargo build --release -p smollm --features trace,cuda --bin gpu_check
//! gpu_check bench [--device cpu|cuda] [--dtype f32|f16|bf16] [--rounds R] [--passes P] [--layers N] [--json OUT]
//! gpu_check verify [--device cpu|cuda] [--json OUT]
//! gpu_check reads [--device cpu|cuda] [--sizes N,N,...] [--rounds R] [--passes P] [--json OUT]
//! gpu_check parts [--device cpu|cuda] [--rounds R] [--passes P] [--json OUT]
//! gpu_check trace --out FILE [--device cpu|cuda] [--dtype f32|f16|bf16] [--passes P] [--layers N] [--capture PATTERN]
//! ```
//!
//! `bench` times a decode step of SmolLM2-135M's shape with random weights (the `model`
//! module: 30 blocks annotated as `examples/smollm` is, 210 traced tensors a pass) against its
//! unannotated twin, with no session, a lightweight session and full tracing into a trace file
//! (see the `bench` module for how it measures). `verify` records tensors on the device and
//! the same tensors on the CPU and compares the statistics and digests model-trace keeps of
//! them (the `verify` module). `reads` times what one tensor's statistics cost in a pass, by
//! size, on each of the two device paths (the `reads` module); `parts` splits one read's host
//! time into its parts, each measured on its own (the `parts` module); `trace` writes the step's trace
//! file, so that the same model on two devices can be diffed (the `trace` module). All take the
//! device from `--device`; by default GPU 0 when the binary was built with the `cuda` feature
//! and one opens, else the CPU, saying so. Built without `--features trace`, the annotations
//! are compiled out: `bench` then measures the untraced step in every configuration, and
//! `verify`, `reads`, `parts` and `trace` refuse to run.
//!
//! Exit status: 0 success (every case matched, for `verify`), 1 a check failed (a mismatch,
//! logits of the traced step that differ from the twin's, record errors), 2 bad arguments or a
//! setup error (no such device, a build without the feature asked for).

mod args;
mod bench;
mod device;
mod model;
mod parts;
mod reads;
mod trace;
mod verify;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use args::Command;

/// Why the program stops early; each kind has its exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad arguments: exit 2, with the usage.
    Usage(String),
    /// The device, a file or candle failed: exit 2.
    Setup(String),
    /// A check failed: exit 1.
    Failed(String),
}

impl Failure {
    fn exit_code(&self) -> ExitCode {
        match self {
            Self::Failed(_) => ExitCode::FAILURE,
            Self::Usage(_) | Self::Setup(_) => ExitCode::from(2),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(message) => write!(f, "error: {message}\n{}", args::USAGE),
            Self::Setup(message) | Self::Failed(message) => write!(f, "error: {message}"),
        }
    }
}

impl From<candle_core::Error> for Failure {
    fn from(error: candle_core::Error) -> Self {
        Self::Setup(format!("candle: {error}"))
    }
}

fn main() -> ExitCode {
    let outcome = match args::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            println!("{}", args::USAGE);
            Ok(())
        }
        Ok(Command::Bench(args)) => bench::run(&args),
        Ok(Command::Verify(args)) => verify::run(&args),
        Ok(Command::Reads(args)) => reads::run(&args),
        Ok(Command::Parts(args)) => parts::run(&args),
        Ok(Command::Trace(args)) => trace::run(&args),
        Err(message) => Err(Failure::Usage(message)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    }
}

/// Refuses a command that needs sessions to record (`verify`, `reads`, `parts`, `trace`) in a
/// build without `--features trace`, where they record nothing.
pub fn require_tracing(command: &str) -> Result<(), Failure> {
    if model_trace::ENABLED {
        return Ok(());
    }
    Err(Failure::Setup(format!(
        "{command}: built without `--features trace`, sessions record nothing; build with \
         `--features trace` (and `cuda` for the GPU)"
    )))
}

/// A directory of its own under the system's temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Result<Self, Failure> {
        let dir = std::env::temp_dir().join(format!("gpu_check-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::Setup(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Self(dir))
    }
}

impl TempDir {
    /// `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp is no reason to fail a finished benchmark.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::Setup(format!("cannot encode the JSON: {e}")))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| Failure::Setup(format!("cannot write {}: {e}", path.display())))
}

/// Tensors the in-memory tracer holds, over every pass and layer (each layer's input, stages
/// and output).
pub fn tensors_recorded(tracer: &model_trace::ModelTracer) -> usize {
    tracer
        .activation_traces()
        .iter()
        .flat_map(|pass| &pass.layers)
        .map(|layer| layer.stages().count())
        .sum()
}

/// Median; the mean of the middle two for an even count, NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}
