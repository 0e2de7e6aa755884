//! Runtime of `model-trace`. Use it through the `model-trace` crate, which re-exports all of it.
//!
//! Each module is one idea: [`TensorStats`] (statistics of one tensor), the five trace kinds
//! (activations, attention, logits, quantization error, KV cache), [`ModelTracer`] that holds them,
//! the thread-local [`Session`] that macros record into, the tracepoint registry and the
//! [`TraceTensor`] trait that reads user tensors.

mod activation;
mod attention;
mod kv_cache;
mod logit;
mod quant;
mod registry;
mod session;
mod stats;
mod tensor;
mod tracer;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use activation::*;
pub use attention::*;
pub use kv_cache::*;
pub use logit::*;
pub use quant::*;
pub use registry::*;
pub use session::*;
pub use stats::*;
pub use tensor::*;
pub use tracer::*;
