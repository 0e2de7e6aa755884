//! Golden traces in tests: did my change move the numbers, and where?
//!
//! [`check`] runs a closure (a forward pass, a short generation) in a session of its own,
//! compares every tensor it recorded with a golden file committed beside the test, through the
//! comparison `model-trace diff` makes, and panics naming the first tensor that differs (pass,
//! layer, stage, by how much) with this run's trace written beside the golden file and the
//! command that shows the rest:
//!
//! ```no_run
//! # use trace_runtime as model_trace;
//! # fn generate(_: &str, _: usize) -> String { String::new() }
//! #[test]
//! fn the_capital_of_france() {
//!     let text = model_trace::golden::check("tests/golden/paris.ndjson", || {
//!         generate("The capital of France is", 4)
//!     });
//!     assert_eq!(text, " Paris.");
//! }
//! ```
//!
//! - **Blessing.** `MODEL_TRACE_BLESS=1 cargo test` writes (or rewrites) the golden files
//!   from this run (also under CI: it is asked for). A missing golden file is written and the
//!   test fails ("review and commit it"), except under CI (`CI` set, as CI services set it),
//!   where it fails without writing: a golden file is made where someone can look at it.
//! - **One golden file per check.** A passing check removes the `.new` trace a failed check of
//!   the same file left; two checks of one file in one run would remove each other's.
//! - **Bit-exact on the machine that blessed it.** A golden file records the machine it was
//!   made on ([`machine`](crate::machine): the architecture and the vector instructions that
//!   libraries pick kernels by). There the check passes only if every tensor has the same
//!   bits as before (equal fingerprints), so a change that moves one value by one unit in
//!   the last place is named. A tolerance on request ([`Golden::rtol`], [`Golden::atol`],
//!   [`Golden::tolerances`]) compares by the recorded statistics instead.
//! - **Another machine.** Other vector instructions make the same program round
//!   differently (a sum reduced 16 lanes at a time instead of 8), so there the check compares
//!   by statistics within [`CROSS_MACHINE_RTOL`] and [`CROSS_MACHINE_ATOL`] (or the tolerance
//!   asked for), and says so: a golden file blessed on a developer's laptop still guards the
//!   CI machine, which would otherwise fail on every fingerprint.
//!
//! What is recorded: every layer's stages, attention probabilities and logits (statistics and
//! fingerprints; no attention rows, no quantization or KV-cache records), in a session that
//! ignores `MODEL_TRACE` and the other environment variables, so a developer's settings do not
//! change what a test compares. [`Golden::config`] and [`Golden::filter`] choose otherwise.
//! The file format is the golden format of [`GoldenHeader`](crate::GoldenHeader): one line
//! per layer of a pass, about 80 KB for SmolLM2-135M's 30 layers over 4 passes, read by every
//! `model-trace` command.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::analysis::compare::{
    compare, CompareOptions, TensorComparison, TensorKey, Tolerance, Tolerances, TraceTensors,
    Verdict,
};
use crate::config::{AttentionTraceConfig, DigestPolicy, ModelTracerConfig};
use crate::format::{write_atomically, GoldenEncoder, ReadError, TraceReader};
use crate::record::{Event, TraceHeader};
use crate::session::{run_recorded, RecordError, SessionError};
use crate::sink::{SinkError, TraceSink};

/// The environment variable that makes a check write its golden file from the run (`1`).
pub const BLESS_ENV_VAR: &str = "MODEL_TRACE_BLESS";

/// The relative tolerance of a check on a machine other than the one that blessed the golden
/// file, when none was asked for: every statistic within `atol + rtol·scale` of the golden
/// one (the scale of a mean or a standard deviation is the tensor's RMS, of a minimum or a
/// maximum its largest magnitude). Rounding differences of other kernels grow through the
/// layers but stay far below it; a changed computation does not.
pub const CROSS_MACHINE_RTOL: f64 = 1e-3;

/// The absolute tolerance that goes with [`CROSS_MACHINE_RTOL`].
pub const CROSS_MACHINE_ATOL: f64 = 1e-5;

/// Runs `run` in a session, compares what it recorded with the golden file at `path` (relative
/// paths are from the working directory: a package's root under `cargo test`) and returns what
/// `run` returned. Panics if they differ, or if the golden file is missing (after writing it,
/// outside CI); `MODEL_TRACE_BLESS=1` writes it instead. [`Golden`] sets a tolerance, what is
/// recorded, or returns the outcome instead of panicking.
#[track_caller]
pub fn check<R>(path: impl AsRef<Path>, run: impl FnOnce() -> R) -> R {
    Golden::new(path).check(run)
}

/// A golden check with its settings: [`check`] with a tolerance, a config or a filter of its
/// own.
///
/// ```no_run
/// # use trace_runtime as model_trace;
/// # fn forward() {}
/// use model_trace::golden::Golden;
///
/// // Statistics within 1e-4 of the golden ones, on any machine.
/// Golden::new("tests/golden/forward.ndjson").rtol(1e-4).check(forward);
/// ```
#[derive(Debug, Clone)]
pub struct Golden {
    path: PathBuf,
    tolerances: Option<Tolerances>,
    config: ModelTracerConfig,
    filter: Option<String>,
    bless: bool,
    in_ci: bool,
}

impl Golden {
    /// A check against the golden file at `path`, bit-exact on the machine that blessed it.
    pub fn new(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().to_path_buf(),
            tolerances: None,
            config: default_config(),
            filter: None,
            bless: std::env::var(BLESS_ENV_VAR).is_ok_and(|v| v == "1"),
            in_ci: std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0"),
        }
    }

    /// Whether to write the golden file from this run instead of checking against it.
    /// Default: `MODEL_TRACE_BLESS=1` in the environment.
    pub fn bless(mut self, bless: bool) -> Self {
        self.bless = bless;
        self
    }

    /// Whether a missing golden file fails the check without being written. Default: `CI`
    /// set to anything but `false` or `0` in the environment (GitHub Actions, GitLab and most
    /// CI services set `CI=true`).
    pub fn in_ci(mut self, in_ci: bool) -> Self {
        self.in_ci = in_ci;
        self
    }

    /// Compares by statistics, each within `rtol` times its scale (and the absolute
    /// tolerance, [`DEFAULT_ATOL`](crate::compare::DEFAULT_ATOL) unless [`atol`](Self::atol) sets it),
    /// on every machine.
    pub fn rtol(mut self, rtol: f64) -> Self {
        self.tolerances
            .get_or_insert_with(default_tolerances)
            .default
            .rtol = rtol;
        self
    }

    /// Compares by statistics with this absolute tolerance (and the relative one,
    /// [`DEFAULT_RTOL`](crate::compare::DEFAULT_RTOL) unless [`rtol`](Self::rtol) sets it).
    pub fn atol(mut self, atol: f64) -> Self {
        self.tolerances
            .get_or_insert_with(default_tolerances)
            .default
            .atol = atol;
        self
    }

    /// Compares by statistics with these tolerances (per-name overrides as `model-trace
    /// diff`'s `--rtol NAME=VALUE` takes them).
    pub fn tolerances(mut self, tolerances: Tolerances) -> Self {
        self.tolerances = Some(tolerances);
        self
    }

    /// Records what `config` says instead of the default (stages, attention probabilities
    /// and logits, with fingerprints). Its `digests` are always
    /// [`Always`](DigestPolicy::Always): a bit-exact check needs every fingerprint.
    pub fn config(mut self, config: ModelTracerConfig) -> Self {
        self.config = ModelTracerConfig {
            digests: DigestPolicy::Always,
            ..config
        };
        self
    }

    /// Records only the tracepoints `filter` admits ([`TraceFilter`](crate::TraceFilter)
    /// syntax).
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// Runs `run` and checks it: returns what `run` returned, or panics with what differs
    /// (see [`check`]).
    #[track_caller]
    pub fn check<R>(&self, run: impl FnOnce() -> R) -> R {
        let (value, outcome) = self.compare(run);
        match outcome {
            Ok(matched) => {
                if let Some(note) = matched.note() {
                    eprintln!("{note}");
                }
                value
            }
            Err(error) => panic!("{error}"),
        }
    }

    /// Runs `run` and compares what it recorded with the golden file: what `run` returned,
    /// and whether it matched. Writes the golden file where [`check`] would, and this run's
    /// trace beside it when they differ.
    pub fn compare<R>(&self, run: impl FnOnce() -> R) -> (R, Result<GoldenMatch, GoldenError>) {
        let recorder = Recorder::default();
        let (value, recorded) = run_recorded(
            self.config.clone(),
            self.filter.as_deref(),
            recorder.clone(),
            run,
        );
        let outcome = match recorded {
            Ok(errors) => self.judge(&recorder, errors),
            Err(error) => Err(GoldenError::Session(error)),
        };
        (value, outcome)
    }

    fn judge(
        &self,
        recorder: &Recorder,
        errors: Vec<RecordError>,
    ) -> Result<GoldenMatch, GoldenError> {
        if !errors.is_empty() {
            return Err(GoldenError::Recording(errors));
        }
        let (text, tensors) = recorder.take();
        if tensors == 0 {
            return Err(GoldenError::NothingRecorded {
                path: self.path.clone(),
            });
        }
        let existing = match std::fs::read_to_string(&self.path) {
            Ok(existing) => Some(existing),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(self.io(source)),
        };
        if self.bless {
            if existing.as_deref() != Some(text.as_str()) {
                self.write(&self.path, &text)?;
            }
            remove_stale(&self.new_path());
            return Ok(GoldenMatch {
                path: self.path.clone(),
                tensors,
                bit_identical: tensors,
                blessed: true,
                tolerant: None,
            });
        }
        let Some(golden) = existing else {
            if self.in_ci {
                return Err(GoldenError::Missing {
                    path: self.path.clone(),
                    written: false,
                });
            }
            self.write(&self.path, &text)?;
            return Err(GoldenError::Missing {
                path: self.path.clone(),
                written: true,
            });
        };
        let (golden_header, reference) = read(&self.path, &golden)?;
        let (_, recorded) = read(&self.new_path(), &text)?;
        let machine = golden_machine(&golden_header);
        let this_machine = crate::format::machine();
        let other_machine = (machine != this_machine).then_some(machine);
        let tolerant = match (&self.tolerances, &other_machine) {
            (Some(tolerances), _) => Some(tolerances.clone()),
            (None, Some(_)) => Some(cross_machine_tolerances()),
            (None, None) => None,
        };
        let options = CompareOptions {
            tolerances: tolerant.clone().unwrap_or_else(exact_tolerances),
            ..CompareOptions::default()
        };
        let comparison = compare(&reference, &recorded, &options, |_, _| {
            None::<Result<Vec<f32>, String>>
        });
        let failed = |pair: &TensorComparison| match tolerant {
            Some(_) => pair.verdict.is_divergence(),
            None => pair.verdict != Verdict::BitIdentical,
        };
        let bit_identical = comparison.count(Verdict::BitIdentical);
        let first = comparison.pairs.iter().find(|p| failed(p)).cloned();
        let differing = comparison.pairs.iter().filter(|p| failed(p)).count();
        if first.is_none() && comparison.missing.is_empty() && comparison.extra.is_empty() {
            remove_stale(&self.new_path());
            return Ok(GoldenMatch {
                path: self.path.clone(),
                tensors: comparison.pairs.len(),
                bit_identical,
                blessed: false,
                tolerant: tolerant.map(|t| Tolerant {
                    tolerance: t.default,
                    other_machine: other_machine.map(|m| (m, this_machine)),
                }),
            });
        }
        let new_path = self.new_path();
        self.write(&new_path, &text)?;
        Err(GoldenError::Mismatch(Box::new(GoldenMismatch {
            path: self.path.clone(),
            new_path,
            first,
            differing,
            compared: comparison.pairs.len(),
            bit_identical,
            missing: comparison.missing,
            extra: comparison.extra,
            tolerance: tolerant.map(|t| t.default),
            other_machine,
        })))
    }

    /// Where this run's trace goes when it differs: `NAME.new.ndjson` beside `NAME.ndjson`.
    fn new_path(&self) -> PathBuf {
        let stem = self
            .path
            .file_stem()
            .map_or_else(|| "golden".into(), |s| s.to_string_lossy().into_owned());
        let ext = self
            .path
            .extension()
            .map_or_else(|| "ndjson".into(), |e| e.to_string_lossy().into_owned());
        self.path.with_file_name(format!("{stem}.new.{ext}"))
    }

    fn write(&self, path: &Path, text: &str) -> Result<(), GoldenError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| GoldenError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        write_atomically(path, |file| file.write_all(text.as_bytes())).map_err(|source| {
            GoldenError::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    fn io(&self, source: std::io::Error) -> GoldenError {
        GoldenError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// What a golden check records unless told otherwise: the stages of every layer, attention
/// probabilities (their statistics: no rows) and logits, each with a fingerprint.
fn default_config() -> ModelTracerConfig {
    ModelTracerConfig {
        trace_activations: true,
        trace_attention: true,
        // No head's rows: the probabilities' summary only.
        attention_config: AttentionTraceConfig {
            heads: Some(Vec::new()),
            ..AttentionTraceConfig::default()
        },
        trace_logits: true,
        digests: DigestPolicy::Always,
        ..ModelTracerConfig::default()
    }
}

fn default_tolerances() -> Tolerances {
    Tolerances::default()
}

/// Nothing allowed: a check on the machine that blessed the file passes by fingerprints only.
fn exact_tolerances() -> Tolerances {
    Tolerances {
        default: Tolerance {
            atol: 0.0,
            rtol: 0.0,
        },
        ..Tolerances::default()
    }
}

fn cross_machine_tolerances() -> Tolerances {
    Tolerances {
        default: Tolerance {
            atol: CROSS_MACHINE_ATOL,
            rtol: CROSS_MACHINE_RTOL,
        },
        ..Tolerances::default()
    }
}

fn remove_stale(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// The machine a golden file's header names.
fn golden_machine(header: &TraceHeader) -> String {
    header
        .metadata
        .extra
        .get("golden_machine")
        .cloned()
        .unwrap_or_default()
}

/// A golden file's text as a trace's tensors.
fn read(path: &Path, text: &str) -> Result<(TraceHeader, TraceTensors), GoldenError> {
    let reader = TraceReader::with_name(text.as_bytes(), path.display().to_string())
        .map_err(GoldenError::Read)?;
    let header = reader.header().clone();
    let events: Vec<Event> = reader
        .collect::<Result<_, _>>()
        .map_err(GoldenError::Read)?;
    let tensors = TraceTensors::from_events(&header, Some(path), events);
    Ok((header, tensors))
}

/// The session's sink: the golden file's text, made as the events come.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Option<GoldenEncoder>>>);

impl Recorder {
    /// The text and the number of tensors recorded.
    fn take(&self) -> (String, usize) {
        let encoder = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default();
        let tensors = encoder.tensors();
        (encoder.finish(), tensors)
    }
}

impl TraceSink for Recorder {
    fn name(&self) -> std::borrow::Cow<'_, str> {
        "golden check".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(GoldenEncoder::default)
            .event(event);
        Ok(())
    }

    fn wants_digests(&self) -> bool {
        true
    }
}

/// A check that passed.
#[derive(Debug, Clone, PartialEq)]
pub struct GoldenMatch {
    /// The golden file.
    pub path: PathBuf,
    /// Tensors compared (or written, when blessed).
    pub tensors: usize,
    /// Of them, those with the same bits.
    pub bit_identical: usize,
    /// Whether the golden file was written from this run (`MODEL_TRACE_BLESS=1`).
    pub blessed: bool,
    /// When compared by statistics (a tolerance asked for, or another machine): how.
    pub tolerant: Option<Tolerant>,
}

/// How a check compared by statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Tolerant {
    /// The tolerance.
    pub tolerance: Tolerance,
    /// The machine that blessed the golden file and this one, when they differ.
    pub other_machine: Option<(String, String)>,
}

impl GoldenMatch {
    /// What a passing check says on stderr: that it blessed, or compared by statistics on
    /// another machine; nothing for a bit-exact match.
    pub fn note(&self) -> Option<String> {
        let path = self.path.display();
        if self.blessed {
            return Some(format!(
                "golden: wrote {path} from this run ({} tensors): review and commit it",
                self.tensors
            ));
        }
        let tolerant = self.tolerant.as_ref()?;
        let (blessed_on, here) = tolerant.other_machine.as_ref()?;
        Some(format!(
            "golden: {path} was blessed on another machine ({blessed_on}; this one: {here}), \
             whose kernels round differently: compared by statistics within rtol {} atol {} \
             ({} of {} tensors bit-identical all the same)",
            tolerant.tolerance.rtol, tolerant.tolerance.atol, self.bit_identical, self.tensors
        ))
    }
}

/// A run that did not match its golden file.
#[derive(Debug, Clone)]
pub struct GoldenMismatch {
    /// The golden file.
    pub path: PathBuf,
    /// This run's trace, written beside it.
    pub new_path: PathBuf,
    /// The first tensor, in the golden run's order, that differs.
    pub first: Option<TensorComparison>,
    /// How many differ.
    pub differing: usize,
    /// How many were compared.
    pub compared: usize,
    /// Of them, those with the same bits.
    pub bit_identical: usize,
    /// In the golden file only.
    pub missing: Vec<TensorKey>,
    /// In this run only.
    pub extra: Vec<TensorKey>,
    /// The tolerance, when compared by statistics; `None`: bit-exact.
    pub tolerance: Option<Tolerance>,
    /// The machine that blessed the golden file, when it is not this one.
    pub other_machine: Option<String>,
}

impl fmt::Display for GoldenMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (golden, new) = (self.path.display(), self.new_path.display());
        writeln!(f, "golden check failed: {golden}")?;
        if let Some(pair) = &self.first {
            writeln!(
                f,
                "  first difference: pass {}, layer {}, {}: {}",
                pair.pass,
                pair.layer,
                pair.name,
                difference(pair, self.tolerance)
            )?;
        }
        let mode = match (&self.tolerance, &self.other_machine) {
            (None, _) => "bit-exact (this machine blessed it)".to_owned(),
            (Some(t), Some(machine)) => format!(
                "by statistics within rtol {} atol {}: blessed on another machine ({machine})",
                t.rtol, t.atol
            ),
            (Some(t), None) => format!("by statistics within rtol {} atol {}", t.rtol, t.atol),
        };
        let within = self
            .compared
            .saturating_sub(self.differing + self.bit_identical);
        let within = if within > 0 {
            format!(", {within} within tolerance")
        } else {
            String::new()
        };
        writeln!(
            f,
            "  compared {mode}: {} of {} tensors differ{within}, {} bit-identical",
            self.differing, self.compared, self.bit_identical
        )?;
        for (what, keys) in [
            ("only in the golden file", &self.missing),
            ("only in this run", &self.extra),
        ] {
            if let Some(first) = keys.first() {
                writeln!(f, "  {} {what}, the first {}", keys.len(), first.describe())?;
            }
        }
        let tolerance = match &self.tolerance {
            None => "--atol 0 --rtol 0 ".to_owned(),
            Some(t) => format!("--atol {} --rtol {} ", t.atol, t.rtol),
        };
        writeln!(f, "  this run's trace:  {new}")?;
        writeln!(
            f,
            "  see every tensor:  model-trace diff {tolerance}{golden} {new}"
        )?;
        write!(
            f,
            "  accept this run:   run this test again with {BLESS_ENV_VAR}=1, then review the golden \
             file's diff and commit it"
        )
    }
}

/// How the first differing tensor differs.
fn difference(pair: &TensorComparison, tolerance: Option<Tolerance>) -> String {
    if pair.verdict == Verdict::ShapeMismatch {
        return format!("shape {:?} became {:?}", pair.shapes.0, pair.shapes.1);
    }
    let worst = pair.checks.first().filter(|c| c.difference > 0.0);
    // The statistics are `f32`s: written as such, not with the digits of their `f64`.
    #[allow(clippy::cast_possible_truncation)]
    let value = |x: f64| (x as f32).to_string();
    match (worst, tolerance) {
        (Some(check), Some(_)) => format!(
            "{} {} became {} ({:.3}× the allowance)",
            check.what,
            value(check.reference),
            value(check.other),
            check.ratio()
        ),
        (Some(check), None) => format!(
            "other bits (its fingerprint changed); {} {} became {}",
            check.what,
            value(check.reference),
            value(check.other)
        ),
        (None, _) => "other bits (its fingerprint changed), the same statistics".to_owned(),
    }
}

/// Why a golden check failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum GoldenError {
    /// The run did not match.
    Mismatch(Box<GoldenMismatch>),
    /// There is no golden file: written from this run (outside CI), or not (under CI).
    Missing {
        /// The golden file.
        path: PathBuf,
        /// Whether it was written now.
        written: bool,
    },
    /// The run recorded no tensor.
    NothingRecorded {
        /// The golden file.
        path: PathBuf,
    },
    /// The session could not start (another one is active on this thread, a bad filter).
    Session(SessionError),
    /// The session reported errors: some records are missing from what was compared.
    Recording(Vec<RecordError>),
    /// The golden file (or this run's) could not be read as one.
    Read(ReadError),
    /// A file could not be read or written.
    Io {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl fmt::Display for GoldenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mismatch(mismatch) => mismatch.fmt(f),
            Self::Missing {
                path,
                written: true,
            } => write!(
                f,
                "golden file {} did not exist: written now from this run; review it and commit \
                 it (the check passes against it from the next run on)",
                path.display()
            ),
            Self::Missing {
                path,
                written: false,
            } => write!(
                f,
                "golden file {} does not exist, and under CI (`CI` is set) a golden file is not \
                 written: run the test with {BLESS_ENV_VAR}=1 where you work, review the file \
                 and commit it",
                path.display()
            ),
            Self::NothingRecorded { path } => write!(
                f,
                "golden check {}: the run recorded no tensor. Is tracing compiled in (the \
                 `enabled` feature of model-trace, or your crate's feature that forwards it), \
                 and does the closure call annotated functions on this thread?",
                path.display()
            ),
            Self::Session(error) => write!(f, "golden check: the session did not start: {error}"),
            Self::Recording(errors) => {
                write!(f, "golden check: the session lost records, so the comparison would be incomplete:")?;
                for error in errors {
                    write!(f, "\n  {error}")?;
                }
                Ok(())
            }
            Self::Read(error) => write!(f, "golden check: {error}"),
            Self::Io { path, source } => {
                write!(f, "golden check: {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for GoldenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Session(error) => Some(error),
            Self::Read(error) => Some(error),
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
