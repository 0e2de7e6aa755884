//! Our own candle port of two mixture-of-experts families, read from transformers'
//! `save_pretrained` output (`config.json`, `model.safetensors`, F32) and chosen by
//! `model_type`: Qwen3-MoE (softmax top-k router) and DeepSeek-V3 (multi-head latent attention,
//! a sigmoid router with a selection bias and grouped top-k, a shared expert), annotated with
//! model-trace. See `model` for the annotation sites, `router` for the routing and `bugs` for
//! the routing bugs that the tests inject.

pub mod attention;
#[doc(hidden)]
pub mod bugs;
pub mod config;
pub mod error;
pub mod experts;
pub mod model;
pub mod passes;
pub mod router;
pub mod weights;

pub use config::Config;
pub use error::{Error, Result};
pub use model::Model;
