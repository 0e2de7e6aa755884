//! Attribute macros of `model-trace`. Use them through the `model-trace` crate.
