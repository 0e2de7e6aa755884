//! Runtime of `model-trace`. Use it through the `model-trace` crate, which re-exports all of it.
//!
//! The folders follow the data, and each imports only those named before it here. On the
//! ground floor, the vocabulary every other folder speaks: `tracepoint` (what each annotation registers, listed
//! by [`tracepoints()`]), `select` (the filters that choose tracepoints, [`TraceFilter`] and
//! [`CaptureFilter`]), `config` ([`ModelTracerConfig`]) and `float` (how values are written).
//! Then `stats` reduces values ([`TensorStats`]), `tensor` reads user tensors through
//! [`TraceTensor`], and `summary` adds fingerprints and sketches; they make up the
//! records and events of `record`; `analysis` holds what is computed over records (the anomaly
//! rules, attention heads, comparing runs, the stage check); `format` reads trace files back and writes captured
//! tensors; `intervene` holds what a session's interventions select and do to the tensors
//! tracepoints see (and replays a reference's captures); `sink` takes events (the in-memory [`ModelTracer`], the trace-file writer, a user's
//! own [`TraceSink`]); the thread-local [`Session`] (`session`) owns the pass and layer context
//! and hands each [`Event`] to its sinks; `golden` (with `enabled`) runs a test's closure in a
//! session and compares it with a committed golden file, `consistency` (with `enabled`) runs
//! two closures that compute the same tokens in other passes and compares them row by row;
//! `__private` is what generated code calls.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

/// Whether tracing is compiled in: `true` with the `enabled` feature (of the `model-trace`
/// crate, or of your crate's feature forwarding to it). Without it, sessions record nothing,
/// [`tracepoints()`] is empty and a session's summary says that tracing is compiled out.
pub const ENABLED: bool = cfg!(feature = "enabled");

// The ground floor: the vocabulary every other module speaks.
mod config;
mod float;
mod id_hash;
mod select;
mod tracepoint;

// The data path, each module importing only those above it in this list.
mod analysis;
mod format;
mod intervene;
mod record;
mod session;
mod sink;
mod stats;
mod summary;
mod tensor;

// The top floor: tests against a committed trace, through a session and a comparison.
#[cfg(feature = "enabled")]
pub mod consistency;
#[cfg(feature = "enabled")]
pub mod golden;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;

pub use analysis::{
    analyze_attention, attention, compare, find_anomalies, stage_check, AttentionAnalysis,
    AttentionAnalyzer, Specialization,
};
pub use config::*;
pub use format::*;
pub use intervene::{
    Action, Intervention, InterventionError, InterventionSelector, InterventionSite,
    ReferenceCaptures,
};
pub use record::*;
pub use select::*;
pub use session::*;
pub use sink::*;
pub use stats::*;
pub use summary::*;
pub use tensor::*;
pub use tracepoint::*;
