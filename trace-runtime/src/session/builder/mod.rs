//! [`SessionBuilder`]: what a session is asked for (sinks, a trace file, captures, a filter,
//! interventions, a rank, what the header says about the run), and how it starts. Each setting is
//! turned into what the running session uses in [`settings`].

mod settings;

use std::fmt;
use std::path::Path;

use super::{Session, SessionError};
use crate::config::ModelTracerConfig;
use crate::format::DEFAULT_CAPTURE_CHUNK_BYTES;
use crate::intervene::{Action, Intervention};
use crate::record::{Precision, RunMetadata};
use crate::select::TraceFilter;
use crate::sink::TraceSink;
use settings::Unusable;

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
    /// A builder with nothing set but `config` ([`Session::builder`]).
    pub(super) fn new(config: ModelTracerConfig) -> Self {
        Self {
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

    /// A builder that records what `filter` admits, in memory ([`Session::with_trace_filter`]).
    pub(super) fn with_parsed_filter(config: ModelTracerConfig, filter: TraceFilter) -> Self {
        let mut builder = Self::new(config);
        builder.parsed_filter = Some(filter);
        builder
    }

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

    /// Saves the full tensors selected by `filter` (syntax on [`CaptureFilter`](crate::CaptureFilter)) as
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
    /// starts; named by `MODEL_TRACE_ISOLATE` (or with [`start_lenient`](Self::start_lenient)),
    /// the session goes on without isolation, and says so ([`try_start`](Self::try_start):
    /// an error there too).
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
    /// A value there that cannot be used is reported, and the session goes on without it (see
    /// [`start`](Self::start); [`try_start`](Self::try_start) makes it an error).
    pub fn from_env(mut self) -> Self {
        self.from_env = true;
        self
    }

    /// Whether the in-memory [`ModelTracer`](crate::ModelTracer) that [`Session::finish`] returns keeps the
    /// records (up to [`ModelTracerConfig::memory_limit_bytes`]) or only the summary.
    ///
    /// Default: the records are kept unless the session writes a trace file, which holds them
    /// all; a file-backed session then costs a summary's memory however long it runs, and its
    /// tracer's [`summary`](crate::ModelTracer::summary) still covers every record while its record
    /// accessors ([`activation_traces`](crate::ModelTracer::activation_traces), ...) are empty. Read
    /// the records back from the file ([`TraceReader`](crate::TraceReader),
    /// [`ModelTracer::from_events`](crate::ModelTracer::from_events)), or ask for them here with `in_memory(true)`.
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
    /// an error of [`start`](Self::start), unlike the other values of the environment: ranks
    /// going on without their rank would all write the same file, each over the others'.
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

    /// The types the run computes in (weights, activations, KV cache), for the header, where
    /// `model-trace diff` reads them to choose its tolerance:
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::{ModelTracerConfig, Precision, Session};
    ///
    /// let session = Session::builder(ModelTracerConfig::lightweight())
    ///     .precision(
    ///         Precision::quantized(["Q4_K", "Q6_K"])
    ///             .activations("F32")
    ///             .kv_cache("F32")
    ///             .source("the port"),
    ///     )
    ///     .start_lenient();
    /// # drop(session);
    /// ```
    ///
    /// With candle's `CANDLE_DEQUANTIZE_ALL` (or `CANDLE_DEQUANTIZE_ALL_F16`) set, as candle
    /// reads it, the quantized weights are recorded as dequantized to f32 (f16), since that is
    /// what candle's `QMatMul::from_arc` then multiplies by; a run that says nothing is recorded
    /// with F32 (F16) weights and the variable as the source, the types they came from not
    /// named (a model whose weights do not go through `QMatMul` should say its precision).
    /// Float weights are left as they are.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.metadata.precision = Some(precision);
        self
    }

    /// Anything else about the run, by name.
    pub fn extra(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.extra.insert(key.into(), value.into());
        self
    }

    /// Starts the session on this thread.
    ///
    /// What the environment says ([`from_env`](Self::from_env)) is the shell's, not the
    /// program's: a value there
    /// that cannot be used (a `MODEL_TRACE` that does not parse, a `MODEL_TRACE_OUT` that cannot
    /// be created, ...) is reported in one line on stderr and in [`Session::errors`], and the
    /// session goes on without it, as with [`Session::start`]. What the builder was given in
    /// code must work.
    ///
    /// # Errors
    ///
    /// A value given to the builder that cannot be used: a filter or capture filter that does
    /// not parse, a trace file that cannot be created (the error names the path), a capture
    /// without a trace file, a rank not below the world size (given, or from `RANK` and
    /// `WORLD_SIZE` with [`rank_from_env`](Self::rank_from_env)), a reference to isolate on that
    /// cannot be replayed.
    pub fn start(self) -> Result<Session, SessionError> {
        self.build(Unusable::ErrorIfGiven)
    }

    /// [`start`](Self::start), but a value of the environment that cannot be used is an error
    /// too, for a program that would rather stop than run without what its caller set.
    ///
    /// # Errors
    ///
    /// Those of [`start`](Self::start), and the same for each value read from the environment.
    pub fn try_start(self) -> Result<Session, SessionError> {
        self.build(Unusable::Error)
    }

    /// Starts the session on this thread whatever happens: a value that cannot be used, given
    /// in code or read from the environment, is reported in one line on stderr and in
    /// [`Session::errors`], and the session goes on without it. For programs whose tracing must
    /// never stop them.
    pub fn start_lenient(self) -> Session {
        let config = self.config.clone();
        // Cannot fail: every value that cannot be used is skipped.
        self.build(Unusable::Skipped)
            .unwrap_or_else(|_| Session::inert(config))
    }
}
