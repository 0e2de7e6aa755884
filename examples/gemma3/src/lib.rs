//! Gemma 3 270M (`gemma3` GGUF, Q4_K_M) on candle, greedy decoding with a KV cache: a modern
//! block (sandwich norms, per-head query/key norms, scaled embeddings, sliding-window and global
//! attention with two RoPE bases, GELU-tanh, K-quants) annotated with model-trace. See `model`
//! for the annotation sites and `bugs` for Gemma's porting bugs that the tests inject.

#[doc(hidden)]
pub mod bugs;
pub mod config;
pub mod error;
pub mod generate;
#[path = "../../shared/gguf.rs"]
pub mod gguf;
pub mod model;
pub mod passes;
#[path = "../../shared/quant_linear.rs"]
pub mod quant_linear;
pub mod rows;
pub mod tokenizer;
pub mod weights;

pub use config::Config;
pub use error::{Error, Result};
pub use model::Model;
pub use tokenizer::GgufTokenizer;
