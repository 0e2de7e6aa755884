//! Gemma 3's hyper-parameters, read from the GGUF metadata, and the ones the architecture fixes.

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Every sixth layer attends globally (layers 5, 11, 17 of 270M's 18); the others through a
/// sliding window. The GGUF does not store the pattern: llama.cpp fixes it for `gemma3` too.
pub const GLOBAL_EVERY: usize = 6;
/// The RoPE base of the sliding-window layers (transformers' `rope_local_base_freq`); the GGUF's
/// `gemma3.rope.freq_base` is the global layers'.
pub const LOCAL_ROPE_THETA: f32 = 10_000.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The global layers' RoPE base (1,000,000 for 270M).
    pub rope_theta: f32,
    /// Linear RoPE scaling of the global layers (`gemma3.rope.scaling.factor`, 4B and up); 1
    /// when the GGUF has none.
    pub rope_scaling: f32,
    /// Keys a sliding-window layer's query sees: its own position and the `sliding_window - 1`
    /// before it (512 for 270M).
    pub sliding_window: usize,
    pub rms_norm_eps: f32,
    pub context_length: usize,
}

impl Config {
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let arch = gguf.string("general.architecture")?;
        if arch != "gemma3" {
            return Err(Error::Gguf(format!(
                "general.architecture is {arch:?}; this is a Gemma 3 implementation"
            )));
        }
        let num_heads = gguf.usize("gemma3.attention.head_count")?;
        let num_kv_heads = gguf.usize("gemma3.attention.head_count_kv")?;
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::Gguf(format!(
                "{num_heads} query heads cannot share {num_kv_heads} KV heads evenly"
            )));
        }
        let head_dim = gguf.usize("gemma3.attention.key_length")?;
        let value_dim = gguf.usize("gemma3.attention.value_length")?;
        if value_dim != head_dim {
            return Err(Error::Gguf(format!(
                "keys of {head_dim} and values of {value_dim} dimensions per head are not \
                 implemented"
            )));
        }
        let rope_scaling = match gguf.string("gemma3.rope.scaling.type") {
            Err(_) | Ok("none") => 1.0,
            Ok("linear") => gguf.f32("gemma3.rope.scaling.factor")?,
            Ok(other) => {
                return Err(Error::Gguf(format!(
                    "gemma3.rope.scaling.type is {other:?}; only linear scaling is implemented"
                )))
            }
        };
        Ok(Self {
            // The length alone: the tokenizer copies the pieces out once, not here too.
            vocab_size: match gguf.value("tokenizer.ggml.tokens")? {
                candle_core::quantized::gguf_file::Value::Array(pieces) => pieces.len(),
                other => {
                    return Err(Error::Gguf(format!(
                        "tokenizer.ggml.tokens is {other:?}, not an array"
                    )))
                }
            },
            hidden_size: gguf.usize("gemma3.embedding_length")?,
            intermediate_size: gguf.usize("gemma3.feed_forward_length")?,
            num_layers: gguf.usize("gemma3.block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: gguf.f32("gemma3.rope.freq_base")?,
            rope_scaling,
            sliding_window: gguf.usize("gemma3.attention.sliding_window")?,
            rms_norm_eps: gguf.f32("gemma3.attention.layer_norm_rms_epsilon")?,
            context_length: gguf.usize("gemma3.context_length")?,
        })
    }

    /// Whether `layer` attends to every position before it (else through the sliding window).
    pub fn is_global(&self, layer: usize) -> bool {
        layer % GLOBAL_EVERY == GLOBAL_EVERY - 1
    }

    /// The scale of the attention scores, `query_pre_attn_scalar^-½`: transformers' config sets
    /// `query_pre_attn_scalar` to the head dimension for every size but 27B (whose
    /// `hidden / heads` llama.cpp special-cases; not handled here).
    pub fn attention_scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// The factor the embeddings are scaled by: `√hidden`, rounded to the activations' dtype (f32
    /// here) as transformers does.
    pub fn embedding_scale(&self) -> f32 {
        (self.hidden_size as f32).sqrt()
    }
}
