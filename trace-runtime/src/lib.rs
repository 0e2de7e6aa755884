//! Runtime of `model-trace`. Use it through the `model-trace` crate, which re-exports all of it.

mod stats;

pub use stats::TensorStats;
