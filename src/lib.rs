//! model-trace: attribute macros that turn transformer forward functions into tracepoints.

pub use trace_runtime::*;
