//! SmolLM2-135M (llama architecture, Q4_1 GGUF) on candle, greedy decoding with a KV cache: the
//! real model model-trace's annotations are exercised on. See `model` for the annotation sites,
//! and `pipeline` for the model cut into stages on threads of their own, traced one rank a stage.

pub mod batch;
#[doc(hidden)]
pub mod bugs;
pub mod causal;
pub mod error;
pub mod generate;
#[path = "../../shared/gguf.rs"]
pub mod gguf;
pub mod model;
pub mod passes;
pub mod pipeline;
#[path = "../../shared/quant_linear.rs"]
pub mod quant_linear;
pub mod report;
pub mod tokenizer;
pub mod trace_level;
pub mod weights;

pub use batch::{Batch, Columns};
pub use error::{Error, Result};
pub use model::{Config, KvCache, Model};
pub use tokenizer::GgufTokenizer;
pub use trace_level::TraceLevel;
