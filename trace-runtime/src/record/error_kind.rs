//! Why something was not recorded: [`RecordErrorKind`], the `kind` of error events.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Declares [`RecordErrorKind`], `ALL` and each kind's name in traces from one table.
macro_rules! record_error_kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// Why something was not recorded, or, for the warnings ([`is_warning`](Self::is_warning)),
        /// why what was recorded is probably not what was meant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum RecordErrorKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl RecordErrorKind {
            /// Every kind.
            pub const ALL: &'static [RecordErrorKind] = &[$(Self::$variant,)*];

            /// The lowercase name written in traces.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }
        }
    };
}

record_error_kinds! {
    /// The value handed to a tracepoint is not a tensor (nor an `Ok`/`Some` of one).
    NotATensor = "not_a_tensor",
    /// A stage recorded outside any `#[trace_layer]`: there is no layer for it to join.
    OutsideLayer = "outside_layer",
    /// The tensor's shape is not what the tracepoint reads (attention without a key dimension,
    /// a shape that does not match the data, logits that are a scalar).
    Shape = "shape",
    /// The tensor backend could not hand out the values (a device or conversion error).
    Read = "read",
    /// A quantized output and its reference differ in length.
    Mismatch = "mismatch",
    /// The session's configuration: an invalid `MODEL_TRACE`, `MODEL_TRACE_OUT` or
    /// `MODEL_TRACE_CAPTURE`.
    Config = "config",
    /// A sink failed (a trace file that could not be written) and was stopped.
    Sink = "sink",
    /// Full tensors could not be saved.
    Capture = "capture",
    /// Warning: layers or logits were recorded outside any `#[trace_model]` function, so they
    /// were counted as one implicit pass (once per session).
    ImplicitPass = "implicit_pass",
    /// Warning: a filter pattern matches none of the program's tracepoints (when the session
    /// starts).
    UnmatchedPattern = "unmatched_pattern",
    /// An intervention asked for cannot be done: the value cannot be changed (not an owned
    /// tensor, a type that cannot be rebuilt from values) or the action does not fit it.
    Intervention = "intervention",
    /// Warning: an intervention changed nothing in the whole session (at its end): it selected
    /// no tensor, or none of its `position=` rows.
    UnusedIntervention = "unused_intervention",
}

impl RecordErrorKind {
    /// Whether this is a warning rather than an error: nothing was lost, but the records are
    /// probably not what was meant. A session prints each warning on stderr when it first
    /// happens and lists them in [`Session::warnings`](crate::Session::warnings), apart from
    /// [`Session::errors`](crate::Session::errors).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            Self::ImplicitPass | Self::UnmatchedPattern | Self::UnusedIntervention
        )
    }
}

impl fmt::Display for RecordErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_what_serde_writes() {
        for &kind in RecordErrorKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(
                serde_json::from_str::<RecordErrorKind>(&json).unwrap(),
                kind
            );
        }
    }
}
