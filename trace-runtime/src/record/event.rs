//! Events: what a session hands to its sinks, one per thing that happened, in the order it
//! happened. A trace file is a header and these events, one per line.
//!
//! Every event carries `seq`, the session's sequence number, increasing in execution order; the
//! stages inside a layer event carry their own. Events that belong to a tracepoint name it
//! (`tracepoint`, and `function`: the annotated function's `module::fn` path), and say which
//! forward pass and layer they were recorded in. Times are nanoseconds on the clock of the
//! file's header (monotonic, from the process's first session).

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::RecordErrorKind;
use crate::record::{
    ActivationAnomalyKind, Anomaly, AttentionWeightTrace, KvCacheStateTrace, LogitEvolutionTrace,
    QuantizationErrorTrace, RouterEvent,
};
use crate::summary::TensorSummary;
use crate::tracepoint::Tracepoint;

/// The `tracepoint` and `function` labels of an event recorded at `tracepoint` (both empty
/// without one): its name, and its function's `module::fn` path.
pub(crate) fn labels(
    tracepoint: Option<&'static Tracepoint>,
) -> (Cow<'static, str>, Cow<'static, str>) {
    tracepoint.map_or((Cow::Borrowed(""), Cow::Borrowed("")), |tp| {
        (Cow::Borrowed(tp.name), Cow::Borrowed(tp.static_path()))
    })
}

/// Declares [`Event`], [`EventKind`] and what goes by an event's kind, from one table: each
/// variant, its record type and the name of its kind in the `event` field.
macro_rules! events {
    ($($(#[$doc:meta])* $variant:ident($record:ty) = $name:literal,)*) => {
        /// One thing that happened in a session.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "event")]
        pub enum Event {
            $($(#[$doc])* #[serde(rename = $name)] $variant($record),)*
        }

        /// What kind of thing an [`Event`] is: the tag in its `event` field.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum EventKind {
            $($(#[$doc])* $variant,)*
        }

        impl EventKind {
            /// Every kind, in the order of [`Event`]'s variants.
            pub const ALL: &'static [EventKind] = &[$(Self::$variant,)*];

            /// The tag as written in the `event` field (`pass_begin`, `layer`, ...).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The kind whose tag is `name`.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|kind| kind.as_str() == name)
            }

            /// Reads one event line of this kind straight into its record type.
            pub(crate) fn parse(self, line: &str) -> Result<Event, serde_json::Error> {
                match self {
                    $(Self::$variant => serde_json::from_str::<$record>(line).map(Event::$variant),)*
                }
            }
        }

        impl Event {
            /// The event's kind.
            pub fn kind(&self) -> EventKind {
                match self {
                    $(Event::$variant(_) => EventKind::$variant,)*
                }
            }

            /// The sequence number.
            pub fn seq(&self) -> u64 {
                match self {
                    $(Event::$variant(e) => e.seq,)*
                }
            }
        }
    };
}

events! {
    /// A forward pass began.
    PassBegin(PassBegin) = "pass_begin",
    /// A forward pass ended; the anomaly rules and the logit evolution of the pass.
    PassEnd(PassEnd) = "pass_end",
    /// A layer call ended: its input, stages and output.
    Layer(LayerEvent) = "layer",
    /// Attention probabilities: a tensor's query rows, sparsely.
    Attention(AttentionEvent) = "attention",
    /// Logits: a tensor's next-token rows.
    Logits(LogitsEvent) = "logits",
    /// One step of a KV cache.
    KvCache(KvCacheEvent) = "kv_cache",
    /// Error of a quantized computation against its reference.
    Quant(QuantEvent) = "quant",
    /// A mixture-of-experts router: per token the experts chosen and their weights. Schema 3 on.
    Router(RouterEvent) = "router",
    /// A tensor a tracepoint saw was changed (ablated, scaled, steered, or by a function of the
    /// user's): what was changed and by how much. Schema 2 on.
    Intervention(InterventionEvent) = "intervention",
    /// A value a tracepoint could not record, a sink that failed, or a warning (its kind says
    /// which: [`RecordErrorKind::is_warning`](crate::RecordErrorKind::is_warning)); first
    /// occurrence, the counts are in [`SessionEnd`].
    Error(ErrorEvent) = "error",
    /// The session ended; a file without it was cut short.
    SessionEnd(SessionEnd) = "session_end",
}

impl Event {
    /// The name of the event's kind, as written in the `event` field.
    pub fn kind_name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The forward pass it belongs to; `None` for a record made outside any pass and for the
    /// session's end.
    pub fn pass(&self) -> Option<usize> {
        match self {
            Event::PassBegin(e) => Some(e.pass),
            Event::PassEnd(e) => Some(e.pass),
            Event::Layer(e) => Some(e.pass),
            Event::Logits(e) => Some(e.pass),
            Event::Attention(e) => e.pass,
            Event::KvCache(e) => e.pass,
            Event::Quant(e) => e.pass,
            Event::Router(e) => e.pass,
            Event::Intervention(e) => e.pass,
            Event::Error(e) => e.pass,
            Event::SessionEnd(_) => None,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A forward pass began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassBegin {
    /// Sequence number.
    pub seq: u64,
    /// The pass: 0, 1, 2, ... in the session.
    pub pass: usize,
    /// Position of the pass's first token (`#[trace_model(position = ..)]`; by default the pass
    /// number).
    pub position: usize,
    /// The `#[trace_model]` tracepoint, or empty for a pass opened implicitly by a record
    /// outside any `#[trace_model]`.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path (empty for an implicit pass).
    pub function: Cow<'static, str>,
    /// When it began, in ns.
    pub start_ns: u64,
    /// The token ids the pass consumed, when the model said
    /// (`#[trace_model(tokens = ..)]`, see [`PassTokens`](crate::PassTokens)): a batch's rows one
    /// after another. Absent from the file when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
}

/// A forward pass ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassEnd {
    /// Sequence number.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// Its position.
    pub position: usize,
    /// Time from its begin to its end, in ns (tracing's own work inside it included).
    pub duration_ns: u64,
    /// Layer calls in the pass.
    pub layers: usize,
    /// Every layer that broke an anomaly rule, and every logits record with a NaN, Inf or
    /// exploding value (stage `logits`), reported one first (see
    /// [`ModelActivationTrace`](crate::ModelActivationTrace)); layers are judged only when
    /// activations are traced, logits when logits are.
    pub anomalies: Vec<Anomaly>,
    /// How the tracked tokens' ranks evolved through the layers, one per batch row that
    /// recorded logits.
    pub logit_evolution: Vec<LogitEvolutionTrace>,
}

impl PassEnd {
    /// The reported anomaly's rule, if any.
    pub fn anomaly_kind(&self) -> Option<ActivationAnomalyKind> {
        self.anomalies.first().map(|a| a.kind)
    }
}

/// One tensor recorded inside a layer: `input`, `output`, or a stage (see
/// [`Stage`](crate::Stage)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageEvent {
    /// Sequence number: stages are numbered in the order they were recorded.
    pub seq: u64,
    /// The stage.
    pub name: Cow<'static, str>,
    /// The tensor.
    pub tensor: TensorSummary,
}

/// A layer call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerEvent {
    /// Sequence number, taken when the layer was entered.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// The layer index.
    pub layer: usize,
    /// The `#[trace_layer]` tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// When it was entered, in ns.
    pub start_ns: u64,
    /// Time inside it, in ns (tracing's own work inside it included).
    pub duration_ns: u64,
    /// `input` (when recorded), the stages in execution order, `output` (when recorded).
    pub stages: Vec<StageEvent>,
    /// The exact residual ratio, when code recording by hand computed it
    /// ([`LayerActivationTrace::record_residual`](crate::LayerActivationTrace::record_residual)).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::float::option"
    )]
    pub residual_ratio: Option<f32>,
}

impl LayerEvent {
    /// The stage called `name` (`input`, `output` or any stage).
    pub fn stage(&self, name: &str) -> Option<&StageEvent> {
        self.stages.iter().find(|stage| stage.name == name)
    }
}

/// Attention probabilities, read as `[batch, heads, q_len, k_len]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The layer the probabilities belong to.
    pub layer: usize,
    /// The attention tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// The whole tensor.
    pub probs: TensorSummary,
    /// The rows kept by the attention filter, each with its batch row, head and query.
    pub rows: Vec<AttentionWeightTrace>,
}

/// One next-token row of a logits tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitRow {
    /// The batch row.
    pub batch: usize,
    /// The highest logits' token ids, best first (`auto_track_top_k` of them).
    pub top_tokens: Vec<u32>,
    /// Their logits.
    #[serde(with = "crate::float::vec")]
    pub top_logits: Vec<f32>,
    /// Rank and logit of each explicitly tracked token (`tracked_tokens`), in that order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tracked: Vec<TrackedLogit>,
}

/// A tracked token in one logit row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrackedLogit {
    /// Token id.
    pub token: u32,
    /// Its logit (NaN outside the vocabulary).
    #[serde(with = "crate::float::single")]
    pub logit: f32,
    /// Logits strictly greater than it (0: the top token).
    pub rank: usize,
    /// Its probability, the softmax of the row at temperature 1; absent in traces written
    /// before it existed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::float::option"
    )]
    pub prob: Option<f32>,
}

/// Logits, read as `[vocab]`, `[batch, vocab]` or `[batch, seq, vocab]` (the last position of
/// each batch row: the next token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// The layer the logits belong to (the final one: one past the last block; for a logit
    /// lens, the layer read).
    pub layer: usize,
    /// The logits tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// The whole tensor.
    pub logits: TensorSummary,
    /// One per batch row (named apart from attention's `rows`, so that tools which infer one
    /// type per field across lines, such as polars, read both).
    pub batch_rows: Vec<LogitRow>,
}

/// One KV-cache step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvCacheEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The kv-cache tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// The cache's state after the step (its `layer` says which layer's cache it is).
    pub state: KvCacheStateTrace,
}

/// Error of a quantized computation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The quant tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// The comparison (its `layer_idx` is the layer it was recorded in).
    pub error: QuantizationErrorTrace,
}

/// A tensor that a tracepoint saw was replaced before the program went on with it.
///
/// Written when the intervention fires, so it comes before the layer event that holds the
/// tensor (a layer event is written when the layer returns); the layer records what it actually
/// received and returned, the replaced values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterventionEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The layer, if one was open.
    pub layer: Option<usize>,
    /// What was replaced: a layer's `input` or `output`, or a stage's name.
    pub stage: Cow<'static, str>,
    /// The tracepoint (the layer's, or the stage's).
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// The intervention as written, `SELECTOR ACTION` (`layer=3 zero`, `stage=attn_out
    /// scale(0.5)`; a closure's action is `closure`).
    pub intervention: String,
    /// Where the new values came from, for a `replace`: the reference trace and the captured
    /// tensor (`ref.ndjson p0.l3.input`); absent for the other actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The token positions changed, `[first, last]` inclusive; `None`: every row.
    #[serde(default)]
    pub positions: Option<[usize; 2]>,
    /// L2 norm of the tensor before the intervention.
    #[serde(with = "crate::float::single")]
    pub before_l2: f32,
    /// L2 norm of the change (new minus old); 0 when the values came out identical.
    #[serde(with = "crate::float::single")]
    pub delta_l2: f32,
}

/// What went wrong (see [`RecordError`](crate::RecordError)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The layer, if one was open.
    pub layer: Option<usize>,
    /// The tracepoint; empty for an error of the session itself.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// What kind of error.
    pub kind: RecordErrorKind,
    /// The message.
    pub message: String,
}

/// The session ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionEnd {
    /// Sequence number: also the number of sequence numbers used.
    pub seq: u64,
    /// When, in ns.
    pub end_ns: u64,
    /// Forward passes begun.
    pub passes: usize,
    /// Every distinct error with its count (at most
    /// [`MAX_DISTINCT_ERRORS`](crate::MAX_DISTINCT_ERRORS) distinct ones are kept).
    pub errors: Vec<ErrorCount>,
    /// Occurrences of further distinct errors, counted but not kept.
    #[serde(default)]
    pub errors_not_kept: usize,
}

/// A distinct error and how often it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCount {
    /// The tracepoint; empty for an error of the session itself.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// What kind of error.
    pub kind: RecordErrorKind,
    /// The message.
    pub message: String,
    /// How often.
    pub occurrences: usize,
}
