//! The header of a session: what a trace file says about itself before its first event.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ModelTracerConfig;
use crate::tracepoint::{tracepoints, Tracepoint, TracepointKind};

/// Version of the trace-file schema this crate writes and reads. A reader refuses a file of a
/// newer version; `docs/trace-format.md` says what each version means.
pub const SCHEMA_VERSION: u32 = 3;

/// The value of the header's `format` field.
pub const FORMAT_NAME: &str = "model-trace";

/// Everything a session says about itself: the first line of a trace file, and what
/// [`TraceSink::start`](crate::TraceSink::start) receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always `"model-trace"`.
    pub format: String,
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema: u32,
    /// Version of the crate (or package) that wrote the file.
    pub writer: String,
    /// The session, unique within its process (sessions number from 1).
    pub session: u64,
    /// Operating-system process id.
    pub process_id: u32,
    /// The thread the session recorded on (a session is per thread).
    pub thread: ThreadInfo,
    /// The clock of every `*_ns` field.
    pub clock: Clock,
    /// What the session records.
    pub config: ModelTracerConfig,
    /// The session's filter (`MODEL_TRACE` syntax); empty: everything.
    pub filter: String,
    /// The capture filter; empty: nothing is captured.
    pub capture: String,
    /// Every tracepoint compiled into the program, sorted.
    pub tracepoints: Vec<TracepointInfo>,
    /// What the user said about the run.
    pub metadata: RunMetadata,
    /// The launch the session belongs to, shared by the ranks of one run: `MODEL_TRACE_RUN`
    /// (read with the rank from the environment, or with the builder's `from_env`), else an id
    /// made once per process. Empty in files written before it existed.
    #[serde(default)]
    pub run: String,
    /// The session's rank among `world_size` ranks (tensor- or pipeline-parallel), if it has
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// How many ranks the run has; set with `rank`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<usize>,
    /// The session's interventions, each as `SELECTOR ACTION` (`MODEL_TRACE_PATCH` syntax; a
    /// closure given in code is `closure`); empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interventions: Vec<String>,
    /// The reference trace whose captured layer inputs every layer was fed
    /// (`SessionBuilder::isolate`, `MODEL_TRACE_ISOLATE`): each layer's output carries that
    /// layer's own error only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate: Option<String>,
}

/// The thread of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Threads that started sessions, numbered from 1 in the order of their first session.
    pub id: u64,
    /// The thread's name, if it has one (`main` for the main thread).
    pub name: Option<String>,
}

/// Times in a trace are nanoseconds of a monotonic clock that starts when the process starts
/// its first session; `epoch_unix_ns` is the wall-clock time of that start, so files of one
/// process share a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    /// Wall-clock time of the clock's zero, in ns since 1970-01-01 UTC.
    pub epoch_unix_ns: u64,
    /// When this session started, on the clock.
    pub session_start_ns: u64,
}

/// A tracepoint as written in a header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracepointInfo {
    /// What it records.
    pub kind: TracepointKind,
    /// Its name.
    pub name: String,
    /// The annotated function's `module::fn` path (the module alone for an inline macro outside
    /// any annotated function).
    pub function: String,
    /// Source file.
    pub file: String,
    /// Line.
    pub line: u32,
    /// The shortest filter pattern that selects this tracepoint alone among the program's
    /// ([`Tracepoint::selector`]); empty when the writer did not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
}

impl TracepointInfo {
    /// Every tracepoint of the program, in [`tracepoints`](crate::tracepoints)' order.
    pub(crate) fn all() -> Vec<Self> {
        let all = tracepoints();
        all.iter()
            .map(|tracepoint| Self::with_selector(tracepoint, tracepoint.selector_among(&all)))
            .collect()
    }

    fn with_selector(tracepoint: &Tracepoint, selector: String) -> Self {
        Self {
            kind: tracepoint.kind,
            name: tracepoint.name.to_owned(),
            function: tracepoint.path(),
            file: tracepoint.file.to_owned(),
            line: tracepoint.line,
            selector,
        }
    }
}

impl From<&Tracepoint> for TracepointInfo {
    fn from(tracepoint: &Tracepoint) -> Self {
        Self::with_selector(tracepoint, tracepoint.selector())
    }
}

/// What a user tells the session about the run, written into the header for whoever reads the
/// trace later. Every field is optional; `extra` takes anything else.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunMetadata {
    /// The model's name (`"SmolLM2-135M-Instruct"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Where its weights came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// The prompt or input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The element type computations run in (`"f32"`, `"q4_1 weights, f32 activations"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The device (`"cpu"`, `"cuda:0"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The types of the weights, activations and KV cache, as `diff` reads them to choose its
    /// tolerance. A session sets it from [`SessionBuilder::precision`](crate::SessionBuilder::precision)
    /// and from candle's `CANDLE_DEQUANTIZE_ALL` (read from the environment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<super::Precision>,
    /// Anything else, by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

impl TraceHeader {
    /// A header of nothing (no session, no tracepoints), for a reader until it has read the
    /// real one, and the base of the header a golden file stands for.
    pub(crate) fn placeholder() -> Self {
        Self {
            format: String::new(),
            schema: 0,
            writer: String::new(),
            session: 0,
            process_id: 0,
            thread: ThreadInfo { id: 0, name: None },
            clock: Clock {
                epoch_unix_ns: 0,
                session_start_ns: 0,
            },
            config: ModelTracerConfig::default(),
            filter: String::new(),
            capture: String::new(),
            tracepoints: Vec::new(),
            metadata: RunMetadata::default(),
            run: String::new(),
            rank: None,
            world_size: None,
            interventions: Vec::new(),
            isolate: None,
        }
    }
}
