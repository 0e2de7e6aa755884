//! The thread-local session that annotated code records into, and where it sends its records.
//!
//! A [`Session`] is current on the thread that started it: tracepoints reached on that thread
//! record into it until [`Session::finish`]. The session owns the context of what is recorded
//! (the forward pass in progress, the layers open inside it, the sequence numbers and times)
//! and hands each record, as an [`Event`](crate::Event), to its sinks: the in-memory
//! [`ModelTracer`] that `finish` returns, a trace file, a user's own [`TraceSink`]. Tracing is
//! per thread because a forward pass runs on one thread and a thread-local needs no lock: the
//! question every tracepoint asks first, "is a session active here?", is one load of a
//! thread-local integer.
//!
//! # Decisions
//!
//! * **Nesting.** Starting a session while another is active on the thread shadows it: the
//!   newest session records, and the previous one resumes when the newer one ends. Sessions may
//!   end in any order.
//! * **The environment.** [`Session::start`] reads `MODEL_TRACE` (a [`TraceFilter`]),
//!   `MODEL_TRACE_OUT` (a trace file), `MODEL_TRACE_CAPTURE` (a [`CaptureFilter`]),
//!   `MODEL_TRACE_PATCH` (interventions) and `MODEL_TRACE_ISOLATE` (a reference to feed every
//!   layer); a value
//!   that cannot be used is reported in one line on stderr and in [`Session::errors`], and the
//!   session goes on without it ([`Session::try_start`] returns the error instead). A
//!   [`SessionBuilder`] reads the environment only when asked ([`SessionBuilder::from_env`]);
//!   [`Session::with_filter`] reads nothing.
//! * **Filters.** The filter selects what is *recorded*. `layer` tracepoints keep the structure
//!   of the pass (layer numbering, the enclosing layer of attention and logits) even when
//!   filtered out, so `MODEL_TRACE=attention:*` still gives attention records the right layer
//!   index; a filtered-out layer records no statistics. Stages follow their layer:
//!   `MODEL_TRACE=layer:*` keeps them unless a pattern excludes them. A `model` pattern selects
//!   forward passes: while a pass it leaves out runs (`-model:draft`), the session is
//!   suspended. The rules are [`TraceFilter`]'s. A pattern that matches none of the program's
//!   tracepoints is a warning when the session starts.
//! * **Passes.** `#[trace_model]` begins and ends a forward pass; a nested one joins the pass
//!   already open. Layers or logits recorded outside any `#[trace_model]` open an implicit pass
//!   that lasts until the next `#[trace_model]` or the end of the session; the first one is a
//!   warning, since it usually means the forward function lacks its annotation.
//! * **Interventions** ([`SessionBuilder::intervene`], `MODEL_TRACE_PATCH`, isolation) change
//!   tensors that tracepoints see, before the program goes on with them; with none, a
//!   tracepoint does what it did without them (one more check of an empty list per layer).
//!   What a tracepoint records is what the program went on with, and every change is an
//!   [`Event::Intervention`](crate::Event::Intervention).
//! * **Unreadable values** (a backend error, a shape that does not fit, a value that is not a
//!   tensor where one is required) never panic: the record is skipped and the reason is kept
//!   in [`Session::errors`], counted per tracepoint, kind and message. They are not hidden:
//!   the summary counts them, and a session that ends with errors nobody asked for ([`finish`],
//!   or a drop) says so in one line on stderr. A program that handles them itself ends the
//!   session with [`finish_with_errors`], which prints nothing.
//! * **Warnings** (an implicit pass, a filter pattern that matches nothing) are printed on
//!   stderr when they first happen, written to the trace file as error events of their own
//!   kinds ([`RecordErrorKind::is_warning`]), counted by the summary and listed by
//!   [`Session::warnings`], apart from the errors.
//! * **Trace files** are named by [`SessionBuilder::trace_file`]'s rule, so sessions of one
//!   process never overwrite each other's files; they are flushed at the end of every forward
//!   pass and when the session ends: at `finish`, when it is dropped, also while a panic unwinds.
//! * **Feature `enabled` off:** the API exists, nothing is recorded and no file is written;
//!   `finish` returns an empty tracer with the configuration it was given, whose summary says
//!   in one line that tracing is compiled out. [`ENABLED`](crate::ENABLED) tells the two builds
//!   apart.
//!
//! [`finish`]: Session::finish
//! [`finish_with_errors`]: Session::finish_with_errors

mod clock;
mod errors;
mod interest;
pub(crate) mod interventions;
pub(crate) mod registry;
pub(crate) mod state;

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use errors::{RecordError, MAX_DISTINCT_ERRORS};

use crate::config::ModelTracerConfig;
use crate::intervene::{Action, Intervention, InterventionError};
use crate::select::{CaptureFilter, FilterError, TraceFilter};

use crate::format::{self, CaptureWriter, DEFAULT_CAPTURE_CHUNK_BYTES};
use crate::record::{
    RecordErrorKind, RunMetadata, TraceHeader, TracepointInfo, FORMAT_NAME, SCHEMA_VERSION,
};
use crate::sink::{ModelTracer, TraceFileSink, TraceSink};
use crate::tracepoint::tracepoints;
use state::{SessionSetup, SessionState};

/// The environment variable that [`Session::start`] reads as a [`TraceFilter`].
pub const FILTER_ENV_VAR: &str = "MODEL_TRACE";
/// The environment variable that [`Session::start`] reads as the trace file's path.
pub const OUT_ENV_VAR: &str = "MODEL_TRACE_OUT";
/// The environment variable that [`Session::start`] reads as a [`CaptureFilter`].
pub const CAPTURE_ENV_VAR: &str = "MODEL_TRACE_CAPTURE";
/// The environment variable that names the run a session belongs to (see
/// [`SessionBuilder::run`]).
pub const RUN_ENV_VAR: &str = "MODEL_TRACE_RUN";
/// The environment variable of the session's interventions (syntax on
/// [`Intervention::parse_list`]), read by [`SessionBuilder::from_env`].
pub const PATCH_ENV_VAR: &str = "MODEL_TRACE_PATCH";
/// The environment variable of the reference trace that isolation replays into every layer
/// (see [`SessionBuilder::isolate`]), read by [`SessionBuilder::from_env`].
pub const ISOLATE_ENV_VAR: &str = "MODEL_TRACE_ISOLATE";

/// Tracing on the current thread, from [`Session::start`] to [`Session::finish`].
///
/// Not `Send`: the session lives in the thread's local state. Dropping it without `finish`
/// ends it the same way (the trace file is complete) but discards the in-memory records.
///
/// ```compile_fail
/// # use trace_runtime as model_trace;
/// fn send<T: Send>(_: T) {}
/// send(model_trace::Session::start(model_trace::ModelTracerConfig::lightweight()));
/// ```
#[must_use = "a session records until it is finished; dropping it discards the in-memory records"]
pub struct Session {
    generation: u32,
    trace_file: Option<PathBuf>,
    #[cfg(not(feature = "enabled"))]
    config: ModelTracerConfig,
    _not_send: PhantomData<*const ()>,
}

/// A session that could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum SessionError {
    /// A trace filter (given, or from `MODEL_TRACE`) does not parse.
    Filter(FilterError),
    /// A capture filter (given, or from `MODEL_TRACE_CAPTURE`) does not parse.
    Capture(FilterError),
    /// The trace file cannot be created.
    CreateFile {
        /// The path tried.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Tensors are to be captured, but there is no trace file to put them beside.
    CaptureWithoutFile,
    /// The rank (given, or from `RANK` and `WORLD_SIZE`) cannot be used; says why.
    Rank(String),
    /// `MODEL_TRACE_PATCH` does not parse.
    Patch(InterventionError),
    /// The reference trace of isolation (given, or from `MODEL_TRACE_ISOLATE`) cannot be
    /// replayed: unreadable, or without captures; says why.
    Isolate(String),
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Filter(error) => write!(f, "{error}"),
            Self::Capture(error) => write!(f, "capture filter: {error}"),
            Self::CreateFile { path, source } => {
                write!(
                    f,
                    "cannot create the trace file {}: {source}",
                    path.display()
                )
            }
            Self::CaptureWithoutFile => f.write_str(
                "tensors are to be captured but no trace file is written \
                 (set MODEL_TRACE_OUT or SessionBuilder::trace_file)",
            ),
            Self::Rank(reason) => write!(f, "rank: {reason}"),
            Self::Patch(error) => write!(f, "{PATCH_ENV_VAR}: {error}"),
            Self::Isolate(reason) => write!(f, "isolation: {reason}"),
        }
    }
}

impl std::error::Error for SessionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Filter(error) | Self::Capture(error) => Some(error),
            Self::CreateFile { source, .. } => Some(source),
            Self::Patch(error) => Some(error),
            Self::CaptureWithoutFile | Self::Rank(_) | Self::Isolate(_) => None,
        }
    }
}

impl From<FilterError> for SessionError {
    fn from(error: FilterError) -> Self {
        Self::Filter(error)
    }
}

impl Session {
    /// Starts recording on this thread with the settings of the environment: `MODEL_TRACE`
    /// filters, `MODEL_TRACE_OUT` writes a trace file, `MODEL_TRACE_CAPTURE` saves tensors,
    /// `MODEL_TRACE_PATCH` and `MODEL_TRACE_ISOLATE` change tensors ([`SessionBuilder::intervene`],
    /// [`SessionBuilder::isolate`]). A
    /// value that cannot be used is reported on stderr and in [`errors`](Self::errors), and
    /// ignored.
    pub fn start(config: ModelTracerConfig) -> Self {
        Session::builder(config).from_env().start_lenient()
    }

    /// Like [`start`](Self::start), but a value of the environment that cannot be used is an
    /// error.
    pub fn try_start(config: ModelTracerConfig) -> Result<Self, SessionError> {
        Session::builder(config).from_env().start()
    }

    /// Starts recording only the tracepoints that `filter` admits (syntax on [`TraceFilter`]),
    /// in memory; no environment variable is read.
    pub fn with_filter(config: ModelTracerConfig, filter: &str) -> Result<Self, FilterError> {
        Ok(Self::with_trace_filter(config, TraceFilter::parse(filter)?))
    }

    /// Starts recording only the tracepoints that `filter` admits, in memory; no environment
    /// variable is read.
    pub fn with_trace_filter(config: ModelTracerConfig, filter: TraceFilter) -> Self {
        let mut builder = Session::builder(config);
        builder.parsed_filter = Some(filter);
        // Nothing in this builder can fail: no file, no capture, no environment.
        builder.build(true).unwrap_or_else(|_| Session::inert())
    }

    /// A builder for a session with sinks, a trace file, captures or metadata.
    pub fn builder(config: ModelTracerConfig) -> SessionBuilder {
        SessionBuilder {
            config,
            filter: Setting::Unset,
            parsed_filter: None,
            trace_file: Setting::Unset,
            capture: Setting::Unset,
            capture_chunk_bytes: DEFAULT_CAPTURE_CHUNK_BYTES,
            metadata: RunMetadata::default(),
            keep_in_memory: None,
            sinks: Vec::new(),
            from_env: false,
            rank: RankSetting::None,
            run: None,
            interventions: Vec::new(),
            isolate: Setting::Unset,
        }
    }

    /// A session that records nothing (used when even the fallback cannot start).
    fn inert() -> Self {
        Self {
            generation: 0,
            trace_file: None,
            #[cfg(not(feature = "enabled"))]
            config: ModelTracerConfig::default(),
            _not_send: PhantomData,
        }
    }

    /// Whether a session records on the current thread.
    pub fn is_active() -> bool {
        registry::active_generation() != 0
    }

    /// The trace file this session writes, if any.
    pub fn trace_file(&self) -> Option<&Path> {
        self.trace_file.as_deref()
    }

    /// What could not be recorded so far, in the order first seen (the warnings apart, in
    /// [`warnings`](Self::warnings)).
    pub fn errors(&self) -> Vec<RecordError> {
        registry::with_session(self.generation, |session| session.errors()).unwrap_or_default()
    }

    /// What was recorded, but probably not as meant, so far: layers recorded outside any
    /// `#[trace_model]` function, filter patterns that match no tracepoint (see
    /// [`RecordErrorKind::is_warning`]). Each was printed on stderr when it first happened.
    pub fn warnings(&self) -> Vec<RecordError> {
        registry::with_session(self.generation, |session| session.warnings()).unwrap_or_default()
    }

    /// Stops recording and returns what was kept in memory. An open forward pass and open
    /// layers are closed first, so their records are kept; the trace file, if any, is complete
    /// when this returns.
    ///
    /// When values could not be recorded, this says so in one line on stderr (how many, and
    /// the first), since it does not return them:
    ///
    /// ```text
    /// model-trace: 3 record errors (first: tensor `x` (src/model.rs:40): stage `x` outside any #[trace_layer]: not recorded (x3)); Session::finish_with_errors returns them
    /// ```
    ///
    /// A program that handles the errors itself calls
    /// [`finish_with_errors`](Self::finish_with_errors) instead, which prints nothing.
    pub fn finish(self) -> ModelTracer {
        let (tracer, errors, not_kept) = self.end();
        report_unclaimed(&errors, not_kept);
        tracer
    }

    /// [`finish`](Self::finish), also returning [`errors`](Self::errors) (among them a trace
    /// file that could not be written); nothing is printed about them.
    pub fn finish_with_errors(self) -> (ModelTracer, Vec<RecordError>) {
        let (tracer, errors, _) = self.end();
        (tracer, errors)
    }

    /// Ends the session: its tracer, its errors and how many further errors were not kept.
    fn end(self) -> (ModelTracer, Vec<RecordError>, usize) {
        let mut this = self;
        match registry::remove(this.generation) {
            Some(session) => {
                let not_kept = session.errors_not_kept();
                let (tracer, errors) = session.into_results();
                (tracer, errors, not_kept)
            }
            None => (this.tracer_without_session(), Vec::new(), 0),
        }
    }

    /// The tracer of a session that recorded nothing: compiled out, or never started.
    fn tracer_without_session(&mut self) -> ModelTracer {
        #[cfg(not(feature = "enabled"))]
        return ModelTracer::compiled_out(std::mem::take(&mut self.config));
        #[cfg(feature = "enabled")]
        ModelTracer::new(ModelTracerConfig::default())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Ends the session (flushing its sinks) if `finish` did not take it already; its
        // errors are reported as `finish` reports them, since nobody can take them now.
        if let Some(session) = registry::remove(self.generation) {
            let not_kept = session.errors_not_kept();
            let (_, errors) = session.into_results();
            report_unclaimed(&errors, not_kept);
        }
    }
}

/// Prints the line of [`Session::finish`] about errors nobody took, if there were any.
fn report_unclaimed(errors: &[RecordError], not_kept: usize) {
    if let Some(line) = unclaimed_errors_line(errors, not_kept) {
        eprintln!("{line}");
    }
}

/// `model-trace: 5 record errors (2 distinct, first: ...); Session::finish_with_errors returns
/// them`, or `None` without errors.
fn unclaimed_errors_line(errors: &[RecordError], not_kept: usize) -> Option<String> {
    let first = errors.first()?;
    let occurrences = errors.iter().map(|e| e.occurrences).sum::<usize>() + not_kept;
    let plural = if occurrences == 1 { "" } else { "s" };
    let distinct = match errors.len() {
        1 if not_kept == 0 => String::new(),
        n if not_kept == 0 => format!("{n} distinct, "),
        n => format!("{n} distinct kept, "),
    };
    Some(format!(
        "model-trace: {occurrences} record error{plural} ({distinct}first: {first}); \
         Session::finish_with_errors returns them"
    ))
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .field("trace_file", &self.trace_file)
            .finish_non_exhaustive()
    }
}

/// A value given to the builder, taken from the environment, or neither.
#[derive(Debug, Clone)]
enum Setting {
    Unset,
    Given(String),
}

/// Sets up a [`Session`]: its sinks, trace file, captures, filter and metadata.
///
/// ```no_run
/// # use trace_runtime as model_trace;
/// use model_trace::{ModelTracerConfig, Session};
///
/// let session = Session::builder(ModelTracerConfig::full())
///     .trace_file("smollm.ndjson")        // a trace file (see the naming rule)
///     .capture("layer:*,pass=0")          // the first pass's layer inputs and outputs in full
///     .model("SmolLM2-135M-Instruct")
///     .prompt("The capital of France is")
///     .start()?;                           // an unwritable path is an error naming it
/// // ... run the model ...
/// let tracer = session.finish();
/// # Ok::<(), model_trace::SessionError>(())
/// ```
#[must_use = "a builder does nothing until `start`"]
pub struct SessionBuilder {
    config: ModelTracerConfig,
    filter: Setting,
    parsed_filter: Option<TraceFilter>,
    trace_file: Setting,
    capture: Setting,
    capture_chunk_bytes: usize,
    metadata: RunMetadata,
    /// `None`: records are kept unless the session writes a trace file.
    keep_in_memory: Option<bool>,
    sinks: Vec<Box<dyn TraceSink>>,
    from_env: bool,
    rank: RankSetting,
    run: Option<String>,
    interventions: Vec<Intervention>,
    isolate: Setting,
}

/// Where a session's rank comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankSetting {
    None,
    Given { rank: usize, world_size: usize },
    FromEnv,
}

impl fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field("config", &self.config)
            .field("filter", &self.filter)
            .field("trace_file", &self.trace_file)
            .field("capture", &self.capture)
            .field("sinks", &self.sinks.len())
            .finish_non_exhaustive()
    }
}

impl SessionBuilder {
    /// Records only the tracepoints that `filter` admits (syntax on [`TraceFilter`]).
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Setting::Given(filter.into());
        self
    }

    /// Writes a trace file (NDJSON, format in `docs/trace-format.md`).
    ///
    /// **Naming rule.** The first session of the process that asks for `path` writes `path`
    /// itself; the `n`-th after it (sessions on other threads, or later sessions) writes
    /// `stem.n.ext` beside it (`run.ndjson`, `run.1.ndjson`, `run.2.ndjson`, ...), so sessions
    /// of one process never overwrite each other's files. A file left by an earlier run of
    /// the program is replaced. [`Session::trace_file`] says which path a session got.
    pub fn trace_file(mut self, path: impl AsRef<Path>) -> Self {
        self.trace_file = Setting::Given(path.as_ref().to_string_lossy().into_owned());
        self
    }

    /// Saves the full tensors selected by `filter` (syntax on [`CaptureFilter`]) as
    /// safetensors files beside the trace file, which this needs.
    pub fn capture(mut self, filter: impl Into<String>) -> Self {
        self.capture = Setting::Given(filter.into());
        self
    }

    /// Size of each captured-tensor file (default 64 MiB): tensors are held in memory until a
    /// file's worth is ready, then written whole.
    pub fn capture_chunk_bytes(mut self, bytes: usize) -> Self {
        self.capture_chunk_bytes = bytes;
        self
    }

    /// Changes the tensors that `selector` selects with `action` before the program goes on
    /// with them (syntax on [`InterventionSelector`](crate::InterventionSelector): by pass, layer, stage and token
    /// position): ablation ([`Action::Zero`]), scaling, steering ([`Action::Add`]) or a
    /// function of your own ([`Action::closure`]). A layer's `input` and `output` and the
    /// stages of `trace_stage!` can be changed; a layer records what it actually received and
    /// returned. Each change is an `intervention` event in the trace, so a trace always says
    /// that it was changed. One that cannot be done (a value that is not an owned tensor) is
    /// an error of the tracepoint, and one that changed nothing in the whole session a warning.
    ///
    /// Several interventions apply in the order given, after those of `MODEL_TRACE_PATCH`.
    ///
    /// # Panics
    ///
    /// When `selector` does not parse: it is written in code. [`Intervention::new`] returns
    /// the error instead, for [`interventions`](Self::interventions).
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::{Action, ModelTracerConfig, Session};
    /// let session = Session::builder(ModelTracerConfig::lightweight())
    ///     .intervene("stage=attn_out,layer=3", Action::Zero)   // ablate layer 3's attention
    ///     .intervene("layer=10,position=4", Action::Scale(2.0)) // one token's residual, doubled
    ///     .start()?;
    /// # drop(session);
    /// # Ok::<(), model_trace::SessionError>(())
    /// ```
    pub fn intervene(mut self, selector: &str, action: Action) -> Self {
        match Intervention::new(selector, action) {
            Ok(intervention) => self.interventions.push(intervention),
            Err(error) => panic!("SessionBuilder::intervene: {error}"),
        }
        self
    }

    /// Feeds every layer the input that the reference trace at `path` captured for the same
    /// pass and layer, so that each layer's output carries that layer's own error only, not
    /// what it inherited from the layers before it: `model-trace diff REF ISOLATED` then names
    /// the layers that are wrong themselves (and `model-trace diff REF PORT --isolated
    /// ISOLATED` shows both errors side by side).
    ///
    /// The reference is any trace with its layers' inputs captured: a Rust program's run with
    /// `MODEL_TRACE_CAPTURE=layer:*`, or transformers traced with
    /// `model_trace.torch.trace(model, path, capture="layer:*")`. It is the intervention
    /// `stage=input replace(REF)`, listed first, and the header's `isolate` names the file.
    /// `MODEL_TRACE_ISOLATE` sets it when the builder reads the environment.
    ///
    /// A reference that cannot be read, or that has no captures, is an error when the session
    /// starts ([`start_lenient`](Self::start_lenient): the session goes on without isolation,
    /// and says so).
    pub fn isolate(mut self, path: impl AsRef<Path>) -> Self {
        self.isolate = Setting::Given(path.as_ref().to_string_lossy().into_owned());
        self
    }

    /// Adds interventions made with [`Intervention::new`] or [`Intervention::parse_list`].
    pub fn interventions(mut self, interventions: impl IntoIterator<Item = Intervention>) -> Self {
        self.interventions.extend(interventions);
        self
    }

    /// Reads `MODEL_TRACE`, `MODEL_TRACE_OUT`, `MODEL_TRACE_CAPTURE`, `MODEL_TRACE_PATCH` and
    /// `MODEL_TRACE_ISOLATE` for what the builder was not given explicitly
    /// (`MODEL_TRACE_PATCH`'s interventions come before those given to the builder).
    pub fn from_env(mut self) -> Self {
        self.from_env = true;
        self
    }

    /// Whether the in-memory [`ModelTracer`] that [`Session::finish`] returns keeps the
    /// records (up to [`ModelTracerConfig::memory_limit_bytes`]) or only the summary.
    ///
    /// Default: the records are kept unless the session writes a trace file, which holds them
    /// all; a file-backed session then costs a summary's memory however long it runs, and its
    /// tracer's [`summary`](ModelTracer::summary) still covers every record while its record
    /// accessors ([`activation_traces`](ModelTracer::activation_traces), ...) are empty. Read
    /// the records back from the file ([`TraceReader`](crate::TraceReader),
    /// [`ModelTracer::from_events`]), or ask for them here with `in_memory(true)`.
    pub fn in_memory(mut self, keep: bool) -> Self {
        self.keep_in_memory = Some(keep);
        self
    }

    /// This session's rank in a run of `world_size` ranks, for a model served tensor- or
    /// pipeline-parallel, where each rank records on its own thread or process. The header
    /// says it (`rank`, `world_size`, and the `run` they share), and a trace file asked for as
    /// `STEM.EXT` is written as `STEM.rank{rank}.EXT`, so the ranks never share a file. A rank
    /// not below `world_size` is an error when the session starts.
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::{ModelTracerConfig, Session};
    /// # let dir = std::env::temp_dir().join(format!("rank-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let session = Session::builder(ModelTracerConfig::lightweight())
    ///     .trace_file(dir.join("run.ndjson"))
    ///     .rank(1, 2)
    ///     .start()?;
    /// # if model_trace::ENABLED {
    /// assert_eq!(session.trace_file(), Some(dir.join("run.rank1.ndjson").as_path()));
    /// # }
    /// # drop(session);
    /// # Ok::<(), model_trace::SessionError>(())
    /// ```
    pub fn rank(mut self, rank: usize, world_size: usize) -> Self {
        self.rank = RankSetting::Given { rank, world_size };
        self
    }

    /// The rank from `RANK` and `WORLD_SIZE`, as distributed launchers set them, and the run
    /// from `MODEL_TRACE_RUN`: see [`rank`](Self::rank). Neither variable set: no rank. One
    /// without the other, a value that is not a number, or a rank not below the world size is
    /// an error when the session starts.
    pub fn rank_from_env(mut self) -> Self {
        self.rank = RankSetting::FromEnv;
        self
    }

    /// The run this session belongs to, for the header: an id that the ranks of one launch
    /// share. Default: `MODEL_TRACE_RUN` when the environment is read ([`from_env`](Self::from_env)
    /// or [`rank_from_env`](Self::rank_from_env)), else an id made once per process, which
    /// the sessions of one process share.
    pub fn run(mut self, run: impl Into<String>) -> Self {
        self.run = Some(run.into());
        self
    }

    /// Adds a sink of the user's.
    pub fn sink(mut self, sink: impl TraceSink + 'static) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// Everything said about the run at once.
    pub fn metadata(mut self, metadata: RunMetadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// The model's name, for the header.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.metadata.model = Some(model.into());
        self
    }

    /// Where the weights came from, for the header.
    pub fn weights(mut self, weights: impl Into<String>) -> Self {
        self.metadata.weights = Some(weights.into());
        self
    }

    /// The prompt or input, for the header.
    pub fn prompt(mut self, prompt: impl Into<String>) -> Self {
        self.metadata.prompt = Some(prompt.into());
        self
    }

    /// The element type computations run in, for the header.
    pub fn dtype(mut self, dtype: impl Into<String>) -> Self {
        self.metadata.dtype = Some(dtype.into());
        self
    }

    /// The device, for the header.
    pub fn device(mut self, device: impl Into<String>) -> Self {
        self.metadata.device = Some(device.into());
        self
    }

    /// Anything else about the run, by name.
    pub fn extra(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.extra.insert(key.into(), value.into());
        self
    }

    /// Starts the session on this thread.
    ///
    /// # Errors
    ///
    /// A filter or capture filter that does not parse, a trace file that cannot be created
    /// (the error names the path), or a capture without a trace file.
    pub fn start(self) -> Result<Session, SessionError> {
        self.build(false)
    }

    /// Starts the session on this thread whatever happens: a value that cannot be used (a
    /// filter that does not parse, a trace file that cannot be created) is reported in one line
    /// on stderr and in [`Session::errors`], and the session goes on without it. For programs
    /// whose tracing must never stop them.
    pub fn start_lenient(self) -> Session {
        let config = self.config.clone();
        self.build(true)
            .unwrap_or_else(|_| Session::with_trace_filter(config, TraceFilter::all()))
    }

    /// `lenient`: a value that cannot be used is reported and ignored rather than an error.
    fn build(mut self, lenient: bool) -> Result<Session, SessionError> {
        let mut setup_errors = Vec::new();
        // `instead`: what the session does without the value, said so nobody has to guess.
        let mut refuse = |error: SessionError,
                          origin: Option<&str>,
                          instead: &str|
         -> Result<(), SessionError> {
            if lenient {
                let origin = origin.map_or_else(String::new, |var| format!("{var}: "));
                let message = format!("{origin}{error}; {instead}");
                if cfg!(feature = "enabled") {
                    eprintln!("model-trace: {message}");
                }
                setup_errors.push((RecordErrorKind::Config, message));
                Ok(())
            } else {
                Err(error)
            }
        };
        let (filter_text, filter_from_env) = self.setting(&self.filter, FILTER_ENV_VAR);
        let filter = match self.parsed_filter.take() {
            Some(filter) => filter,
            None => match TraceFilter::parse(filter_text.as_deref().unwrap_or("")) {
                Ok(filter) => filter,
                Err(error) => {
                    refuse(
                        SessionError::Filter(error),
                        filter_from_env,
                        "going on without the whole filter: every tracepoint is traced",
                    )?;
                    TraceFilter::all()
                }
            },
        };
        if !cfg!(feature = "enabled") {
            return Ok(Session::disabled(self.config));
        }
        let rank = match self.resolve_rank() {
            Ok(rank) => rank,
            Err(error) => {
                let origin = (self.rank == RankSetting::FromEnv).then_some("RANK and WORLD_SIZE");
                refuse(error, origin, "going on without a rank")?;
                None
            }
        };
        let (capture_text, capture_from_env) = self.setting(&self.capture, CAPTURE_ENV_VAR);
        let capture = match capture_text
            .as_deref()
            .map(CaptureFilter::parse)
            .transpose()
        {
            Ok(capture) => capture.filter(|c| !c.is_empty()),
            Err(error) => {
                refuse(
                    SessionError::Capture(error),
                    capture_from_env,
                    "going on without captures",
                )?;
                None
            }
        };
        let mut interventions = Vec::new();
        if self.from_env {
            if let Ok(text) = std::env::var(PATCH_ENV_VAR) {
                match Intervention::parse_list(&text) {
                    Ok(parsed) => interventions = parsed,
                    Err(error) => refuse(
                        SessionError::Patch(error),
                        None,
                        "going on without interventions",
                    )?,
                }
            }
        }
        let (isolate_text, isolate_from_env) = self.setting(&self.isolate, ISOLATE_ENV_VAR);
        let mut isolate = None;
        if let Some(path) = isolate_text.filter(|path| !path.is_empty()) {
            let replay = Action::replace(&path).and_then(|action| {
                Intervention::new("stage=input", action).map_err(|e| e.to_string())
            });
            match replay {
                Ok(replay) => {
                    interventions.insert(0, replay);
                    isolate = Some(path);
                }
                Err(reason) => refuse(
                    SessionError::Isolate(reason),
                    isolate_from_env,
                    "going on without isolation: the layers get their own inputs",
                )?,
            }
        }
        let (file_text, file_from_env) = self.setting(&self.trace_file, OUT_ENV_VAR);
        let mut trace_file = None;
        let mut capture_writer = None;
        if let Some(requested) = file_text.filter(|path| !path.is_empty()) {
            let requested = Path::new(&requested);
            let path = format::claim_path(&match rank {
                Some((rank, _)) => format::ranked(requested, rank),
                None => requested.to_path_buf(),
            });
            match TraceFileSink::create(&path) {
                Ok(sink) => {
                    if let Some(filter) = &capture {
                        capture_writer = Some((
                            filter.clone(),
                            CaptureWriter::new(&path, self.capture_chunk_bytes),
                        ));
                    }
                    self.sinks.insert(0, Box::new(sink));
                    trace_file = Some(path);
                }
                Err(source) => refuse(
                    SessionError::CreateFile { path, source },
                    file_from_env,
                    "going on without a trace file",
                )?,
            }
        }
        if capture.is_some() && capture_writer.is_none() && trace_file.is_none() {
            refuse(
                SessionError::CaptureWithoutFile,
                capture_from_env,
                "going on without captures",
            )?;
        }
        let origin = filter_from_env.unwrap_or("filter");
        for pattern in filter.unmatched(&tracepoints()) {
            let effect = if pattern.starts_with('-') {
                "excludes"
            } else {
                "selects"
            };
            setup_errors.push((
                RecordErrorKind::UnmatchedPattern,
                format!(
                    "{origin} pattern `{pattern}` matches none of the program's tracepoints, so \
                     it {effect} nothing (model_trace::tracepoints() lists them)"
                ),
            ));
        }
        interventions.append(&mut self.interventions);
        for intervention in &interventions {
            for pattern in intervention.selector().unmatched(&tracepoints()) {
                setup_errors.push((
                    RecordErrorKind::UnmatchedPattern,
                    format!(
                        "intervention `{intervention}`: pattern `{pattern}` matches none of the \
                         program's tracepoints, so it changes nothing"
                    ),
                ));
            }
        }
        let mut header = self.header(&filter, capture.as_ref(), rank, &interventions);
        header.isolate = isolate;
        let setup = SessionSetup {
            config: self.config,
            filter,
            keep_in_memory: self.keep_in_memory.unwrap_or(trace_file.is_none()),
            sinks: self.sinks,
            capture: capture_writer,
            header,
            setup_errors,
            interventions,
        };
        let generation = registry::push(SessionState::new(setup));
        Ok(Session {
            generation,
            trace_file,
            // Not reached without `enabled` (returned above); the field exists only then.
            #[cfg(not(feature = "enabled"))]
            config: ModelTracerConfig::default(),
            _not_send: PhantomData,
        })
    }

    /// The value of a setting: given, else from `var` when reading the environment; with the
    /// variable's name when it came from there.
    fn setting(
        &self,
        given: &Setting,
        var: &'static str,
    ) -> (Option<String>, Option<&'static str>) {
        match given {
            Setting::Given(value) => (Some(value.clone()), None),
            Setting::Unset if self.from_env => match std::env::var(var) {
                Ok(value) => (Some(value), Some(var)),
                Err(std::env::VarError::NotPresent) => (None, None),
                Err(std::env::VarError::NotUnicode(raw)) => {
                    (Some(raw.to_string_lossy().into_owned()), Some(var))
                }
            },
            Setting::Unset => (None, None),
        }
    }

    /// The rank and world size the builder was given or the environment says.
    fn resolve_rank(&self) -> Result<Option<(usize, usize)>, SessionError> {
        let (rank, world_size) = match self.rank {
            RankSetting::None => return Ok(None),
            RankSetting::Given { rank, world_size } => (rank, world_size),
            RankSetting::FromEnv => {
                let var = |name: &str| std::env::var(name).ok();
                match rank_from_vars(var("RANK").as_deref(), var("WORLD_SIZE").as_deref())
                    .map_err(SessionError::Rank)?
                {
                    Some(pair) => pair,
                    None => return Ok(None),
                }
            }
        };
        if rank >= world_size {
            return Err(SessionError::Rank(format!(
                "rank {rank} is not below the world size {world_size}"
            )));
        }
        Ok(Some((rank, world_size)))
    }

    /// The run the header names: given, else `MODEL_TRACE_RUN` when the environment is read,
    /// else the process's own id.
    fn run_id(&self) -> String {
        let reads_env = self.from_env || self.rank == RankSetting::FromEnv;
        self.run
            .clone()
            .or_else(|| {
                reads_env
                    .then(|| std::env::var(RUN_ENV_VAR).ok())
                    .flatten()
                    .filter(|run| !run.is_empty())
            })
            .unwrap_or_else(process_run_id)
    }

    fn header(
        &self,
        filter: &TraceFilter,
        capture: Option<&CaptureFilter>,
        rank: Option<(usize, usize)>,
        interventions: &[Intervention],
    ) -> TraceHeader {
        static SESSIONS: AtomicU64 = AtomicU64::new(1);
        TraceHeader {
            format: FORMAT_NAME.to_owned(),
            schema: SCHEMA_VERSION,
            writer: format!("model-trace {}", env!("CARGO_PKG_VERSION")),
            session: SESSIONS.fetch_add(1, Ordering::Relaxed),
            process_id: std::process::id(),
            thread: clock::this_thread(),
            clock: crate::record::Clock {
                session_start_ns: clock::now_ns(),
                epoch_unix_ns: clock::epoch_unix_ns(),
            },
            config: self.config.clone(),
            filter: filter.to_string(),
            capture: capture.map(ToString::to_string).unwrap_or_default(),
            tracepoints: TracepointInfo::all(),
            metadata: self.metadata.clone(),
            run: self.run_id(),
            rank: rank.map(|(rank, _)| rank),
            world_size: rank.map(|(_, world_size)| world_size),
            interventions: interventions.iter().map(ToString::to_string).collect(),
            isolate: None,
        }
    }
}

impl Session {
    /// The session of a build without the `enabled` feature: it records nothing.
    #[cfg_attr(feature = "enabled", allow(dead_code))]
    fn disabled(config: ModelTracerConfig) -> Self {
        let _ = &config;
        Self {
            generation: 0,
            trace_file: None,
            #[cfg(not(feature = "enabled"))]
            config,
            _not_send: PhantomData,
        }
    }
}

/// `RANK` and `WORLD_SIZE` as a launcher sets them: both or neither.
fn rank_from_vars(
    rank: Option<&str>,
    world_size: Option<&str>,
) -> Result<Option<(usize, usize)>, String> {
    let number = |name: &str, value: &str| {
        value
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("{name}={value:?} is not a number"))
    };
    match (rank, world_size) {
        (None, None) => Ok(None),
        (Some(rank), Some(world_size)) => Ok(Some((
            number("RANK", rank)?,
            number("WORLD_SIZE", world_size)?,
        ))),
        (Some(_), None) => {
            Err("RANK is set but WORLD_SIZE is not (set both or neither)".to_owned())
        }
        (None, Some(_)) => {
            Err("WORLD_SIZE is set but RANK is not (set both or neither)".to_owned())
        }
    }
}

/// This process's run id: the wall-clock time of its first session and its process id.
fn process_run_id() -> String {
    format!("{:x}-{}", clock::epoch_unix_ns(), std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_and_world_size_come_together_as_numbers() {
        assert_eq!(rank_from_vars(None, None), Ok(None));
        assert_eq!(rank_from_vars(Some("1"), Some(" 4 ")), Ok(Some((1, 4))));
        let only_rank = rank_from_vars(Some("1"), None).unwrap_err();
        assert!(only_rank.contains("WORLD_SIZE is not"), "{only_rank}");
        let only_world = rank_from_vars(None, Some("2")).unwrap_err();
        assert!(only_world.contains("RANK is not"), "{only_world}");
        let bad = rank_from_vars(Some("one"), Some("2")).unwrap_err();
        assert_eq!(bad, "RANK=\"one\" is not a number");
    }

    #[test]
    fn a_rank_must_be_below_the_world_size() {
        let builder = Session::builder(ModelTracerConfig::lightweight()).rank(2, 2);
        let error = builder.resolve_rank().unwrap_err();
        assert_eq!(
            error.to_string(),
            "rank: rank 2 is not below the world size 2"
        );
        let builder = Session::builder(ModelTracerConfig::lightweight()).rank(1, 2);
        assert_eq!(builder.resolve_rank().unwrap(), Some((1, 2)));
    }

    #[test]
    fn sessions_of_one_process_share_a_run_unless_given_one() {
        let builder = || Session::builder(ModelTracerConfig::lightweight());
        assert_eq!(builder().run_id(), builder().run_id());
        assert_eq!(builder().run("launch-7").run_id(), "launch-7");
    }
}
