//! Why something was not recorded: [`RecordErrorKind`], the `kind` of error events.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why something was not recorded, or, for the warnings ([`is_warning`](Self::is_warning)), why
/// what was recorded is probably not what was meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordErrorKind {
    /// The value handed to a tracepoint is not a tensor (nor an `Ok`/`Some` of one).
    NotATensor,
    /// A stage recorded outside any `#[trace_layer]`: there is no layer for it to join.
    OutsideLayer,
    /// The tensor's shape is not what the tracepoint reads (attention without a key dimension,
    /// a shape that does not match the data, logits that are a scalar).
    Shape,
    /// The tensor backend could not hand out the values (a device or conversion error).
    Read,
    /// A quantized output and its reference differ in length.
    Mismatch,
    /// The session's configuration: an invalid `MODEL_TRACE`, `MODEL_TRACE_OUT` or
    /// `MODEL_TRACE_CAPTURE`.
    Config,
    /// A sink failed (a trace file that could not be written) and was stopped.
    Sink,
    /// Full tensors could not be saved.
    Capture,
    /// Warning: layers or logits were recorded outside any `#[trace_model]` function, so they
    /// were counted as one implicit pass (once per session).
    ImplicitPass,
    /// Warning: a filter pattern matches none of the program's tracepoints (when the session
    /// starts).
    UnmatchedPattern,
}

impl RecordErrorKind {
    /// The lowercase name written in traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotATensor => "not_a_tensor",
            Self::OutsideLayer => "outside_layer",
            Self::Shape => "shape",
            Self::Read => "read",
            Self::Mismatch => "mismatch",
            Self::Config => "config",
            Self::Sink => "sink",
            Self::Capture => "capture",
            Self::ImplicitPass => "implicit_pass",
            Self::UnmatchedPattern => "unmatched_pattern",
        }
    }

    /// Whether this is a warning rather than an error: nothing was lost, but the records are
    /// probably not what was meant. A session prints each warning on stderr when it first
    /// happens and lists them in [`Session::warnings`](crate::Session::warnings), apart from
    /// [`Session::errors`](crate::Session::errors).
    pub fn is_warning(self) -> bool {
        matches!(self, Self::ImplicitPass | Self::UnmatchedPattern)
    }
}

impl fmt::Display for RecordErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
