//! The thread-local session that annotated code records into.
//!
//! A [`Session`] makes a [`ModelTracer`] current on the thread that started it; tracepoints
//! reached on that thread record into it until [`Session::finish`] hands it back. Tracing is
//! per thread because a forward pass runs on one thread and a thread-local needs no lock: the
//! question every tracepoint asks first, "is a session active here?", is one load of a
//! thread-local integer.
//!
//! # Decisions
//!
//! * **Nesting.** Starting a session while another is active on the thread shadows it: the
//!   newest session records, and the previous one resumes when the newer one ends. Sessions may
//!   end in any order.
//! * **Filters.** [`Session::start`] reads the `MODEL_TRACE` environment variable as a
//!   [`TraceFilter`]; [`Session::with_filter`] takes one explicitly and ignores the variable.
//!   An invalid `MODEL_TRACE` is reported on stderr and in [`Session::errors`], and the session
//!   records as if it were unset ([`Session::try_start`] returns the error instead).
//!   The filter selects what is *recorded*. `model` and `layer` tracepoints keep the structure of
//!   the pass (pass boundaries, layer numbering, the enclosing layer of attention and logits)
//!   even when filtered out, so `MODEL_TRACE=attention:*` still gives attention records the right
//!   layer index; a filtered-out layer records no statistics.
//! * **Passes.** `#[trace_model]` begins and ends a forward pass; a nested one joins the pass
//!   already open. Layers or logits recorded outside any `#[trace_model]` open an implicit pass
//!   that lasts until the next `#[trace_model]` or the end of the session.
//! * **Unreadable values** (a backend error, a shape that does not fit, a value that is not a
//!   tensor where one is required) never panic: the record is skipped and the reason is kept
//!   in [`Session::errors`], counted per tracepoint and message.
//! * **Feature `enabled` off:** the API exists, nothing is recorded, `finish` returns an empty
//!   tracer with the configuration it was given.

mod filter;
pub(crate) mod state;

use std::fmt;
use std::marker::PhantomData;

pub use filter::{FilterError, TraceFilter};

use crate::registry::Tracepoint;
use crate::tracer::{ModelTracer, ModelTracerConfig};

/// The environment variable that [`Session::start`] reads as a [`TraceFilter`].
pub const FILTER_ENV_VAR: &str = "MODEL_TRACE";

/// Tracing on the current thread, from [`Session::start`] to [`Session::finish`].
///
/// Not `Send`: the session lives in the thread's local state. Dropping it without `finish`
/// discards what it recorded.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// send(trace_runtime::Session::start(trace_runtime::ModelTracerConfig::lightweight()));
/// ```
#[must_use = "a session records until it is finished; dropping it discards the records"]
pub struct Session {
    generation: u32,
    #[cfg(not(feature = "enabled"))]
    config: ModelTracerConfig,
    _not_send: PhantomData<*const ()>,
}

impl Session {
    /// Starts recording on this thread, limited by `MODEL_TRACE` when it is set.
    pub fn start(config: ModelTracerConfig) -> Self {
        match env_filter() {
            Ok(filter) => Self::with_trace_filter(config, filter),
            Err(error) => {
                if cfg!(feature = "enabled") {
                    eprintln!("model-trace: {error}; {FILTER_ENV_VAR} is ignored");
                }
                let session = Self::with_trace_filter(config, TraceFilter::all());
                session.note_error(format!("{error}; {FILTER_ENV_VAR} is ignored"));
                session
            }
        }
    }

    /// Like [`start`](Self::start), but an invalid `MODEL_TRACE` is an error.
    pub fn try_start(config: ModelTracerConfig) -> Result<Self, FilterError> {
        Ok(Self::with_trace_filter(config, env_filter()?))
    }

    /// Starts recording only the tracepoints that `filter` admits (syntax on [`TraceFilter`]);
    /// `MODEL_TRACE` is not read.
    pub fn with_filter(config: ModelTracerConfig, filter: &str) -> Result<Self, FilterError> {
        Ok(Self::with_trace_filter(config, TraceFilter::parse(filter)?))
    }

    /// Starts recording only the tracepoints that `filter` admits.
    pub fn with_trace_filter(config: ModelTracerConfig, filter: TraceFilter) -> Self {
        #[cfg(feature = "enabled")]
        {
            let generation = state::push(config, filter);
            Self {
                generation,
                _not_send: PhantomData,
            }
        }
        #[cfg(not(feature = "enabled"))]
        {
            let _ = filter;
            Self {
                generation: 0,
                config,
                _not_send: PhantomData,
            }
        }
    }

    /// Whether a session records on the current thread.
    pub fn is_active() -> bool {
        state::active_generation() != 0
    }

    /// Values that tracepoints could not record so far, in the order first seen.
    pub fn errors(&self) -> Vec<RecordError> {
        state::with_session(self.generation, |session| session.errors.clone()).unwrap_or_default()
    }

    /// Runs `record` on this session's tracer, for records made by hand next to annotated code.
    /// `None` when tracing is compiled out.
    pub fn with_tracer<R>(&self, record: impl FnOnce(&mut ModelTracer) -> R) -> Option<R> {
        state::with_session(self.generation, |session| record(&mut session.tracer))
    }

    /// Stops recording and returns what was recorded. An open forward pass and open layers are
    /// closed first, so their records are kept.
    pub fn finish(self) -> ModelTracer {
        self.finish_with_errors().0
    }

    /// [`finish`](Self::finish), also returning [`errors`](Self::errors).
    pub fn finish_with_errors(self) -> (ModelTracer, Vec<RecordError>) {
        #[cfg(feature = "enabled")]
        {
            match state::remove(self.generation) {
                Some(session) => session.into_results(),
                None => (ModelTracer::new(ModelTracerConfig::default()), Vec::new()),
            }
        }
        #[cfg(not(feature = "enabled"))]
        {
            let mut this = self;
            let config = std::mem::take(&mut this.config);
            (ModelTracer::new(config), Vec::new())
        }
    }

    fn note_error(&self, message: String) {
        state::with_session(self.generation, |session| session.note_error(None, message));
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(state::remove(self.generation));
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

fn env_filter() -> Result<TraceFilter, FilterError> {
    if !cfg!(feature = "enabled") {
        return Ok(TraceFilter::all());
    }
    match std::env::var(FILTER_ENV_VAR) {
        Ok(filter) => TraceFilter::parse(&filter),
        Err(std::env::VarError::NotPresent) => Ok(TraceFilter::all()),
        Err(std::env::VarError::NotUnicode(raw)) => TraceFilter::parse(&raw.to_string_lossy()),
    }
}

/// A value that a tracepoint could not record, and how often that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// The tracepoint, or `None` for errors of the session itself (an invalid `MODEL_TRACE`).
    pub tracepoint: Option<&'static Tracepoint>,
    /// Why the value was not recorded.
    pub message: String,
    /// How many times this tracepoint failed with this message.
    pub occurrences: usize,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tracepoint {
            Some(tracepoint) => write!(
                f,
                "{} `{}` ({}:{}): {}",
                tracepoint.kind, tracepoint.name, tracepoint.file, tracepoint.line, self.message
            )?,
            None => f.write_str(&self.message)?,
        }
        if self.occurrences > 1 {
            write!(f, " (x{})", self.occurrences)?;
        }
        Ok(())
    }
}

impl std::error::Error for RecordError {}
