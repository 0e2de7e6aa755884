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
//!   layer). A [`SessionBuilder`] reads the environment only when asked
//!   ([`SessionBuilder::from_env`]); [`Session::with_filter`] reads nothing.
//! * **Starting.** "Start" means one thing, on [`Session`] and on [`SessionBuilder`]: what the
//!   environment says is the shell's, not the program's, so a value there that cannot be used is
//!   reported in one line on stderr and in [`Session::errors`], and the session goes on without
//!   it; what the program gave the builder in code must work, and is an error of
//!   [`SessionBuilder::start`] when it does not. [`Session::start`] is given nothing in code, so
//!   it cannot fail. `try_start` ([`Session::try_start`], [`SessionBuilder::try_start`]) makes
//!   the environment's values errors too; [`SessionBuilder::start_lenient`] makes none an error.
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
//! [`CaptureFilter`]: crate::CaptureFilter
//! [`TraceSink`]: crate::TraceSink
//! [`RecordErrorKind::is_warning`]: crate::RecordErrorKind::is_warning

mod builder;
mod clock;
mod errors;
mod interest;
pub(crate) mod interventions;
pub(crate) mod registry;
pub(crate) mod state;

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

pub use builder::SessionBuilder;
pub use errors::{RecordError, MAX_DISTINCT_ERRORS};

use crate::config::ModelTracerConfig;
use crate::intervene::InterventionError;
use crate::select::{FilterError, TraceFilter};
use crate::sink::{ModelTracer, TraceSink};

/// The environment variable that [`Session::start`] reads as a [`TraceFilter`].
pub const FILTER_ENV_VAR: &str = "MODEL_TRACE";
/// The environment variable that [`Session::start`] reads as the trace file's path.
pub const OUT_ENV_VAR: &str = "MODEL_TRACE_OUT";
/// The environment variable that [`Session::start`] reads as a [`CaptureFilter`](crate::CaptureFilter).
pub const CAPTURE_ENV_VAR: &str = "MODEL_TRACE_CAPTURE";
/// The environment variable that names the run a session belongs to (see
/// [`SessionBuilder::run`]).
pub const RUN_ENV_VAR: &str = "MODEL_TRACE_RUN";
/// The environment variable of the session's interventions (syntax on
/// [`Intervention::parse_list`](crate::Intervention::parse_list)), read by [`SessionBuilder::from_env`].
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

/// Runs `run` in a session of its own that records what `config` says (of the tracepoints
/// `filter` admits) into `sink` alone, reading no environment variable: what `run` returned,
/// and the values the session could not record, or why it could not start. The checks in tests
/// (`golden`, `consistency`) are built on it.
#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
pub(crate) fn run_recorded<R>(
    config: ModelTracerConfig,
    filter: Option<&str>,
    sink: impl TraceSink + 'static,
    run: impl FnOnce() -> R,
) -> (R, Result<Vec<RecordError>, SessionError>) {
    let mut builder = Session::builder(config).in_memory(false).sink(sink);
    if let Some(filter) = filter {
        builder = builder.filter(filter);
    }
    let session = match builder.start() {
        Ok(session) => session,
        Err(error) => return (run(), Err(error)),
    };
    let value = run();
    let (_, errors) = session.finish_with_errors();
    (value, Ok(errors))
}

impl Session {
    /// Starts recording on this thread with the settings of the environment: `MODEL_TRACE`
    /// filters, `MODEL_TRACE_OUT` writes a trace file, `MODEL_TRACE_CAPTURE` saves tensors,
    /// `MODEL_TRACE_PATCH` and `MODEL_TRACE_ISOLATE` change tensors ([`SessionBuilder::intervene`],
    /// [`SessionBuilder::isolate`]).
    ///
    /// A setting of the environment that is wrong never stops the program: a value that cannot
    /// be used (a filter that does not parse, a trace file that cannot be created, a reference
    /// without captures to isolate on) is reported in one line on stderr and in
    /// [`errors`](Self::errors), and the session goes on without it:
    ///
    /// ```text
    /// model-trace: MODEL_TRACE_OUT: cannot create the trace file /no/such/dir/run.ndjson: No such file or directory (os error 2); going on without a trace file
    /// ```
    ///
    /// This is `Session::builder(config).from_env().start_lenient()`: with nothing given in
    /// code, what [`SessionBuilder::start`] does, without its `Result` (an unusable `RANK` is
    /// not read here: `rank_from_env` is the builder's).
    pub fn start(config: ModelTracerConfig) -> Self {
        Session::builder(config).from_env().start_lenient()
    }

    /// [`start`](Self::start), but a value of the environment that cannot be used is an error
    /// ([`SessionBuilder::try_start`]).
    pub fn try_start(config: ModelTracerConfig) -> Result<Self, SessionError> {
        Session::builder(config).from_env().try_start()
    }

    /// Starts recording only the tracepoints that `filter` admits (syntax on [`TraceFilter`]),
    /// in memory; no environment variable is read.
    pub fn with_filter(config: ModelTracerConfig, filter: &str) -> Result<Self, FilterError> {
        Ok(Self::with_trace_filter(config, TraceFilter::parse(filter)?))
    }

    /// Starts recording only the tracepoints that `filter` admits, in memory; no environment
    /// variable is read.
    pub fn with_trace_filter(config: ModelTracerConfig, filter: TraceFilter) -> Self {
        SessionBuilder::with_parsed_filter(config, filter).start_lenient()
    }

    /// A builder for a session with sinks, a trace file, captures or metadata.
    pub fn builder(config: ModelTracerConfig) -> SessionBuilder {
        SessionBuilder::new(config)
    }

    /// A session that records nothing: every session of a build without the `enabled`
    /// feature (`config` is kept for the tracer that [`finish`](Self::finish) returns), and
    /// what [`SessionBuilder::start_lenient`] would fall back on if it could fail.
    fn inert(config: ModelTracerConfig) -> Self {
        let _ = &config;
        Self {
            generation: 0,
            trace_file: None,
            #[cfg(not(feature = "enabled"))]
            config,
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
    /// [`RecordErrorKind::is_warning`](crate::RecordErrorKind::is_warning)). Each was printed
    /// on stderr when it first happened.
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
