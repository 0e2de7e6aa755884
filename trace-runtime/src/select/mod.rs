//! Which tracepoints and tensors are selected: the filter a session records by
//! ([`TraceFilter`], `MODEL_TRACE`), the one that chooses tensors to save in full
//! ([`CaptureFilter`], `MODEL_TRACE_CAPTURE`), their glob, and the shortest pattern that
//! selects one tracepoint ([`Tracepoint::selector`](crate::Tracepoint::selector)).

mod capture;
mod filter;
mod glob;
mod range;
mod selector;

pub use capture::CaptureFilter;
pub use filter::{FilterError, TraceFilter};
pub(crate) use glob::glob_match;
pub(crate) use range::IndexRange;
