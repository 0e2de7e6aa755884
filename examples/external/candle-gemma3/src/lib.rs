//! candle-transformers' own quantized Gemma 3 (`models/quantized_gemma3.rs`, copied unchanged
//! but for its annotations), traced with model-trace as a user's crate would trace it: outside
//! model-trace's workspace, depending on the `model-trace` crate, tracing compiled in by this
//! crate's `trace` feature.
//!
//! What it is for: the three relations of a model against itself (N tokens in one pass = a
//! prefill and decode steps; a prompt in chunks = whole; a batch = each prompt alone), run on
//! code nobody at model-trace wrote, past Gemma 3's 512-key sliding window. The test
//! (`tests/relations.rs`) checks them with `model_trace::consistency::Consistency`; the binary
//! writes the same runs as trace files for `model-trace diff`. The README says what they found.

// candle-transformers' sources call candle-core `candle`; so does the copy of its model.
extern crate candle_core as candle;

pub mod error;
/// Typed access to a GGUF's metadata: model-trace's examples' `examples/shared/gguf.rs`.
#[path = "../../../shared/gguf.rs"]
pub mod gguf;
pub mod quantized_gemma3;
pub mod runs;
/// Gemma's SentencePiece tokenizer read from the GGUF: model-trace's Gemma 3 example's
/// `examples/gemma3/src/tokenizer.rs`.
#[path = "../../../gemma3/src/tokenizer.rs"]
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
pub use runs::Gemma3;
