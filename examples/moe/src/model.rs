//! The model: a decoder of pre-norm blocks whose feed-forward half is a mixture of experts (or,
//! in the layers the config names, a dense MLP), written so that every value model-trace
//! annotates has a function or a `let` of its own:
//!
//! | annotation | site |
//! |------------|------|
//! | `#[trace_model(position = position, tokens = ids)]` | [`Model::forward`]: one pass, prefill or decode step |
//! | `#[trace_layer(index = self.index)]` | [`Block::forward`] |
//! | `trace_tensor!("attn_in" / "attn_out" / "resid_mid" / "mlp_in" / "mlp_out")` | the `let`s of the same names in [`Block::forward`] |
//! | `trace_tensor!("q_norm" / "k_norm")` | Qwen3-MoE's attention: per head, `[batch, seq, heads, head_dim]` |
//! | `#[trace_attention]` | [`crate::attention::attention_probs`] |
//! | `#[trace_logits]` | [`Model::logits`] |
//! | `#[trace_router(scoring = softmax)]` | Qwen3-MoE's router (`Router::route_softmax`): `(logits, weights, experts)` |
//! | `#[trace_router(scoring = sigmoid, bias = .., groups = (.., ..))]` | DeepSeek-V3's router (`Router::route_sigmoid`) |
//!
//! The block, as transformers' `Qwen3MoeDecoderLayer` and `DeepseekV3DecoderLayer` compute it:
//!
//! ```text
//! attn_in  = norm(x)                 mlp_in  = norm(resid_mid)
//! attn_out = attention(attn_in)      mlp_out = experts(mlp_in)  (or the dense MLP)
//! resid_mid = x + attn_out           output  = resid_mid + mlp_out
//! ```
//!
//! Built without the `trace` feature the annotations are compiled out. Weights, activations and
//! the KV cache are f32 on the CPU.

use crate::attention::{Attention, KvCache, RmsNorm, Rotary};
use crate::config::{AttentionConfig, Config};
use crate::error::{Error, Result as LoadResult};
use crate::experts::{Mlp, MoeBlock};
use crate::weights::Weights;
use candle_core::{Device, IndexOp, Module, Result, Tensor};
use candle_nn::Linear;
use model_trace::{trace_layer, trace_logits, trace_model, trace_tensor, Precision};
use std::path::Path;
use std::sync::Arc;

/// A block's feed-forward half.
pub enum FeedForward {
    Dense(Mlp),
    Experts(MoeBlock),
}

impl FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Experts(moe) => moe.forward(x),
        }
    }
}

pub struct Block {
    /// The block's place in the model, 0 for the first: its layer index in traces.
    index: usize,
    attn_norm: RmsNorm,
    attn: Attention,
    mlp_norm: RmsNorm,
    mlp: FeedForward,
}

impl Block {
    fn load(
        weights: &Weights,
        index: usize,
        config: &Config,
        rotary: Arc<Rotary>,
    ) -> LoadResult<Self> {
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        let prefix = format!("model.layers.{index}");
        let norm =
            |name: &str| RmsNorm::load(weights, &format!("{prefix}.{name}.weight"), hidden, eps);
        let mlp = if config.moe_layers[index] {
            FeedForward::Experts(MoeBlock::load(weights, index, hidden, &config.moe)?)
        } else {
            let mlp = Mlp::load(
                weights,
                &format!("{prefix}.mlp"),
                hidden,
                config.intermediate_size,
            )?;
            FeedForward::Dense(mlp)
        };
        Ok(Self {
            index,
            attn_norm: norm("input_layernorm")?,
            attn: Attention::load(weights, index, config, rotary)?,
            mlp_norm: norm("post_attention_layernorm")?,
            mlp,
        })
    }

    /// One block over `x: [batch, seq, hidden]` at positions `position..`; returns the residual
    /// stream after it. Its stages are the `let`s of the same names (the meanings of
    /// `model_trace::Stage`).
    #[trace_layer(index = self.index)]
    pub fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache) -> Result<Tensor> {
        let attn_in = self.attn_norm.forward(x)?;
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attn.forward(&attn_in, position, cache)?;
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = (x + &attn_out)?;
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = self.mlp_norm.forward(&resid_mid)?;
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = self.mlp.forward(&mlp_in)?;
        trace_tensor!("mlp_out", &mlp_out);
        &resid_mid + &mlp_out
    }

    /// The block's place in the model, 0 for the first.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the block's feed-forward half is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        matches!(self.mlp, FeedForward::Experts(_))
    }
}

pub struct Model {
    config: Config,
    /// `[vocab, hidden]`.
    embeddings: Tensor,
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    norm: RmsNorm,
    head: Linear,
}

impl Model {
    /// Loads the model of `dir` (`config.json`, `model.safetensors`).
    pub fn load(dir: &Path) -> LoadResult<Self> {
        let config = Config::load(dir)?;
        let weights = Weights::load(dir)?;
        Self::from_weights(config, &weights)
    }

    pub fn from_weights(config: Config, weights: &Weights) -> LoadResult<Self> {
        let rotary_dim = match config.attention {
            AttentionConfig::Grouped { head_dim, .. } => head_dim,
            AttentionConfig::Latent(ref latent) => latent.qk_rope_head_dim,
        };
        let rotary = Arc::new(Rotary::new(
            config.rope_theta,
            rotary_dim,
            config.max_position_embeddings,
        )?);
        let blocks = (0..config.num_layers)
            .map(|i| Block::load(weights, i, &config, rotary.clone()))
            .collect::<LoadResult<Vec<_>>>()?;
        let (vocab, hidden) = (config.vocab_size, config.hidden_size);
        let embeddings = weights.get("model.embed_tokens.weight", &[vocab, hidden])?;
        let head = if weights.has("lm_head.weight") || !config.tie_word_embeddings {
            weights.get("lm_head.weight", &[vocab, hidden])?
        } else {
            embeddings.clone()
        };
        let norm = RmsNorm::load(weights, "model.norm.weight", hidden, config.rms_norm_eps)?;
        Ok(Self {
            caches: (0..config.num_layers).map(|_| KvCache::default()).collect(),
            config,
            embeddings,
            blocks,
            norm,
            head: Linear::new(head, None),
        })
    }

    /// Runs `ids`, the sequence's tokens from `position` on, and returns the logits `[vocab]` for
    /// the token after the last one. `position == 0` starts a new sequence (the KV caches are
    /// cleared); otherwise `position` must be the number of positions already cached.
    #[trace_model(position = position, tokens = ids)]
    pub fn forward(&mut self, ids: &[u32], position: usize) -> Result<Tensor> {
        if position == 0 {
            self.caches.iter_mut().for_each(KvCache::clear);
        }
        let cached = self.caches.first().map_or(0, KvCache::len);
        if cached != position {
            candle_core::bail!("forward at position {position}, but {cached} positions are cached");
        }
        let mut x = self
            .embeddings
            .embedding(&Tensor::new(ids, &Device::Cpu)?)?
            .unsqueeze(0)?;
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            x = block.forward(&x, position, cache)?;
        }
        let last = x.i((.., ids.len() - 1, ..))?.contiguous()?;
        self.logits(&last)?.squeeze(0)
    }

    /// `hidden: [batch, hidden] -> [batch, vocab]`: the final norm and the output head.
    #[trace_logits]
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.norm.forward(hidden)?)
    }

    /// Fails unless `ids` can run from `position` on: at least one, each in the vocabulary, all
    /// within the context.
    pub fn check_tokens(&self, ids: &[u32], position: usize) -> LoadResult<()> {
        let vocab = self.config.vocab_size;
        if ids.is_empty() {
            return Err(Error::Tokens("a pass needs at least one token".into()));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Tokens(format!(
                "token {id} is outside the vocabulary of {vocab}"
            )));
        }
        let end = position + ids.len();
        let context = self.config.max_position_embeddings;
        if end > context {
            return Err(Error::Tokens(format!(
                "{end} positions exceed the context of {context}"
            )));
        }
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// What the model computes in, for the trace header: F32 weights, activations and KV cache.
    pub fn precision(&self) -> Precision {
        Precision::float("F32")
            .activations("F32")
            .kv_cache("F32")
            .source("the port")
    }
}

/// Index of the largest logit; the first one on ties.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    let values = logits.flatten_all()?.to_vec1::<f32>()?;
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    Ok(best as u32)
}
