//! The attention half of a block: Qwen 3's grouped-query attention with per-head query/key RMS
//! norms, and DeepSeek's multi-head latent attention; the rotary tables, the RMS norm and the
//! KV cache they share.

use crate::config::{AttentionConfig, Config, LatentConfig};
use crate::error::Result as LoadResult;
use crate::weights::Weights;
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::Linear;
use model_trace::{trace_attention, trace_tensor};
use std::sync::Arc;

/// The epsilon of DeepSeek's latent norms (`q_a_layernorm`, `kv_a_layernorm`): transformers
/// builds them with `DeepseekV3RMSNorm`'s default, not the config's `rms_norm_eps`.
const LATENT_NORM_EPS: f64 = 1e-6;

/// `x / rms(x) · w` over the last dimension, in f32.
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn load(weights: &Weights, name: &str, width: usize, eps: f64) -> LoadResult<Self> {
        Ok(Self {
            weight: weights.get(name, &[width])?,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}

/// A linear map without bias from `weights`' `name`, `[outputs, inputs]`.
pub fn linear(weights: &Weights, name: &str, outputs: usize, inputs: usize) -> LoadResult<Linear> {
    Ok(Linear::new(weights.get(name, &[outputs, inputs])?, None))
}

/// RoPE's `cos` and `sin`, `[positions, dim / 2]`, for every position of the context.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// The tables of rotary dimension `dim` and base `theta` (f32, as transformers computes them).
    pub fn new(theta: f64, dim: usize, positions: usize) -> Result<Self> {
        let inv_freq: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / dim as f32))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, dim / 2), &Device::Cpu)?;
        let positions = Tensor::arange(0u32, positions as u32, &Device::Cpu)?
            .to_dtype(DType::F32)?
            .reshape((positions, 1))?;
        let angles = positions.matmul(&inv_freq)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }

    /// Rotates `x: [batch, heads, seq, dim]` at positions `position..position + seq`, the two
    /// halves of each head as the rotation's pairs (transformers' `rotate_half`).
    pub fn apply(&self, x: &Tensor, position: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, position, seq)?;
        let sin = self.sin.narrow(0, position, seq)?;
        candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)
    }

    /// The same for dimensions laid out in interleaved pairs `(x0, x1), (x2, x3), ...`, the
    /// result laid out as transformers' `apply_rotary_pos_emb_interleave` returns it: the even
    /// dimensions rotated, then the odd ones.
    pub fn apply_interleaved(&self, x: &Tensor, position: usize) -> Result<Tensor> {
        let (batch, heads, seq, dim) = x.dims4()?;
        let halves = x
            .reshape((batch, heads, seq, dim / 2, 2))?
            .transpose(3, 4)?
            .reshape((batch, heads, seq, dim))?;
        self.apply(&halves, position)
    }

    /// Positions the tables hold.
    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// One layer's cached keys and values (or, for latent attention, its latents), `[batch, heads,
/// positions, dim]`, grown along the positions.
#[derive(Default)]
pub struct KvCache {
    cached: Option<(Tensor, Tensor)>,
}

impl KvCache {
    /// Appends `k`, `v` and returns every cached position, the new ones included.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = match &self.cached {
            None => (k.contiguous()?, v.contiguous()?),
            Some((ck, cv)) => (Tensor::cat(&[ck, k], 2)?, Tensor::cat(&[cv, v], 2)?),
        };
        self.cached = Some((k.clone(), v.clone()));
        Ok((k, v))
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.cached
            .as_ref()
            .map_or(0, |(k, _)| k.dims().get(2).copied().unwrap_or(0))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.cached = None;
    }
}

/// Either attention, by the model's family.
pub enum Attention {
    Grouped(GroupedAttention),
    Latent(LatentAttention),
}

impl Attention {
    /// Layer `layer`'s attention under `model.layers.{layer}.self_attn`.
    pub fn load(
        weights: &Weights,
        layer: usize,
        config: &Config,
        rotary: Arc<Rotary>,
    ) -> LoadResult<Self> {
        let prefix = format!("model.layers.{layer}.self_attn");
        Ok(match &config.attention {
            &AttentionConfig::Grouped {
                num_kv_heads,
                head_dim,
            } => Attention::Grouped(GroupedAttention::load(
                weights,
                &prefix,
                config,
                (num_kv_heads, head_dim),
                rotary,
            )?),
            AttentionConfig::Latent(latent) => Attention::Latent(LatentAttention::load(
                weights, &prefix, config, latent, rotary,
            )?),
        })
    }

    /// `x: [batch, seq, hidden]` at positions `position..` -> `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache) -> Result<Tensor> {
        match self {
            Attention::Grouped(attention) => attention.forward(x, position, cache),
            Attention::Latent(attention) => attention.forward(x, position, cache),
        }
    }
}

/// Softmax attention probabilities `[batch, heads, q_len, k_len]` of `q: [batch, heads, q_len,
/// dim]` over `k: [batch, heads, k_len, dim]`, the queries at positions `position..` of a causal
/// sequence whose keys start at 0.
#[trace_attention]
pub fn attention_probs(q: &Tensor, k: &Tensor, position: usize, scale: f64) -> Result<Tensor> {
    let (q_len, k_len) = (q.dim(2)?, k.dim(2)?);
    let scores = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? * scale)?;
    let scores = if q_len > 1 {
        scores.broadcast_add(&causal_mask(position, q_len, k_len)?)?
    } else {
        scores
    };
    candle_nn::ops::softmax_last_dim(&scores)
}

/// `[q_len, k_len]`: 0 where query `i` (at `position + i`) sees key `j`, `-inf` past it.
fn causal_mask(position: usize, q_len: usize, k_len: usize) -> Result<Tensor> {
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|i| {
            (0..k_len).map(move |j| {
                if j <= position + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (q_len, k_len), &Device::Cpu)
}

/// Qwen 3's attention: grouped-query, queries and keys RMS-normed per head before RoPE.
pub struct GroupedAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    rotary: Arc<Rotary>,
}

impl GroupedAttention {
    /// The attention under `prefix` with `(num_kv_heads, head_dim)`.
    fn load(
        weights: &Weights,
        prefix: &str,
        config: &Config,
        (num_kv_heads, head_dim): (usize, usize),
        rotary: Arc<Rotary>,
    ) -> LoadResult<Self> {
        let (hidden, heads) = (config.hidden_size, config.num_heads);
        let name = |part: &str| format!("{prefix}.{part}.weight");
        Ok(Self {
            q: linear(weights, &name("q_proj"), heads * head_dim, hidden)?,
            k: linear(weights, &name("k_proj"), num_kv_heads * head_dim, hidden)?,
            v: linear(weights, &name("v_proj"), num_kv_heads * head_dim, hidden)?,
            o: linear(weights, &name("o_proj"), hidden, heads * head_dim)?,
            q_norm: RmsNorm::load(weights, &name("q_norm"), head_dim, config.rms_norm_eps)?,
            k_norm: RmsNorm::load(weights, &name("k_norm"), head_dim, config.rms_norm_eps)?,
            num_heads: heads,
            num_kv_heads,
            head_dim,
            rotary,
        })
    }

    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache) -> Result<Tensor> {
        let (batch, seq, _) = x.dims3()?;
        let (heads, kv_heads, dim) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = self.q.forward(x)?.reshape((batch, seq, heads, dim))?;
        let k = self.k.forward(x)?.reshape((batch, seq, kv_heads, dim))?;
        let v = self
            .v
            .forward(x)?
            .reshape((batch, seq, kv_heads, dim))?
            .transpose(1, 2)?;
        let q_norm = self.q_norm.forward(&q)?;
        trace_tensor!("q_norm", &q_norm);
        let k_norm = self.k_norm.forward(&k)?;
        trace_tensor!("k_norm", &k_norm);
        let q = self.rotary.apply(&q_norm.transpose(1, 2)?, position)?;
        let k = self.rotary.apply(&k_norm.transpose(1, 2)?, position)?;
        let (k, v) = cache.append(&k, &v)?;
        // Query head h reads KV head h / group, as transformers' `repeat_kv`.
        let group = heads / kv_heads;
        let k = repeat_heads(&k, group)?;
        let v = repeat_heads(&v, group)?;
        let probs = attention_probs(&q, &k, position, (dim as f64).powf(-0.5))?;
        let out = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((batch, seq, heads * dim))?;
        self.o.forward(&out)
    }
}

/// `[batch, kv_heads, len, dim]` -> `[batch, kv_heads · group, len, dim]`, each head repeated
/// `group` times in place.
fn repeat_heads(x: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(x.clone());
    }
    let (batch, kv_heads, len, dim) = x.dims4()?;
    x.unsqueeze(2)?
        .broadcast_as((batch, kv_heads, group, len, dim))?
        .reshape((batch, kv_heads * group, len, dim))
}

/// How the latent attention makes its queries: one projection, or two through a normed
/// low-rank bottleneck.
enum QueryProjection {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

impl QueryProjection {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            QueryProjection::Direct(q) => q.forward(x),
            QueryProjection::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?),
        }
    }
}

/// DeepSeek's multi-head latent attention (transformers' `DeepseekV3Attention`): the cache holds
/// each position's normed latent `[batch, 1, len, kv_lora_rank]` and its rotated key
/// `[batch, 1, len, qk_rope_head_dim]`, expanded into every head's keys and values each pass.
pub struct LatentAttention {
    q: QueryProjection,
    kv_a: Linear,
    kv_norm: RmsNorm,
    kv_b: Linear,
    o: Linear,
    num_heads: usize,
    kv_lora_rank: usize,
    nope_dim: usize,
    rope_dim: usize,
    v_dim: usize,
    rope_interleave: bool,
    rotary: Arc<Rotary>,
}

impl LatentAttention {
    fn load(
        weights: &Weights,
        prefix: &str,
        config: &Config,
        latent: &LatentConfig,
        rotary: Arc<Rotary>,
    ) -> LoadResult<Self> {
        let &LatentConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim: nope_dim,
            qk_rope_head_dim: rope_dim,
            v_head_dim: v_dim,
            rope_interleave,
        } = latent;
        let (hidden, heads) = (config.hidden_size, config.num_heads);
        let name = |part: &str| format!("{prefix}.{part}.weight");
        let q_width = heads * (nope_dim + rope_dim);
        let q = match q_lora_rank {
            None => QueryProjection::Direct(linear(weights, &name("q_proj"), q_width, hidden)?),
            Some(rank) => QueryProjection::LowRank {
                a: linear(weights, &name("q_a_proj"), rank, hidden)?,
                norm: RmsNorm::load(weights, &name("q_a_layernorm"), rank, LATENT_NORM_EPS)?,
                b: linear(weights, &name("q_b_proj"), q_width, rank)?,
            },
        };
        let kv_b_width = heads * (nope_dim + v_dim);
        Ok(Self {
            q,
            kv_a: linear(
                weights,
                &name("kv_a_proj_with_mqa"),
                kv_lora_rank + rope_dim,
                hidden,
            )?,
            kv_norm: RmsNorm::load(
                weights,
                &name("kv_a_layernorm"),
                kv_lora_rank,
                LATENT_NORM_EPS,
            )?,
            kv_b: linear(weights, &name("kv_b_proj"), kv_b_width, kv_lora_rank)?,
            o: linear(weights, &name("o_proj"), hidden, heads * v_dim)?,
            num_heads: heads,
            kv_lora_rank,
            nope_dim,
            rope_dim,
            v_dim,
            rope_interleave,
            rotary,
        })
    }

    fn rotate(&self, x: &Tensor, position: usize) -> Result<Tensor> {
        if self.rope_interleave {
            self.rotary.apply_interleaved(x, position)
        } else {
            self.rotary.apply(x, position)
        }
    }

    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache) -> Result<Tensor> {
        let (batch, seq, _) = x.dims3()?;
        let (heads, nope, rope) = (self.num_heads, self.nope_dim, self.rope_dim);
        let q = self
            .q
            .forward(x)?
            .reshape((batch, seq, heads, nope + rope))?
            .transpose(1, 2)?;
        let q_rot = self.rotate(&q.narrow(D::Minus1, nope, rope)?, position)?;
        let q = Tensor::cat(&[&q.narrow(D::Minus1, 0, nope)?, &q_rot], D::Minus1)?;
        let compressed = self.kv_a.forward(x)?;
        let latent = self
            .kv_norm
            .forward(&compressed.narrow(D::Minus1, 0, self.kv_lora_rank)?)?
            .reshape((batch, 1, seq, self.kv_lora_rank))?;
        let k_rot = compressed
            .narrow(D::Minus1, self.kv_lora_rank, rope)?
            .reshape((batch, 1, seq, rope))?;
        let k_rot = self.rotate(&k_rot, position)?;
        let (latent, k_rot) = cache.append(&latent, &k_rot)?;
        let (k, v) = self.expand(&latent, &k_rot)?;
        let scale = ((nope + rope) as f64).powf(-0.5);
        let probs = attention_probs(&q, &k, position, scale)?;
        let out = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((batch, seq, heads * self.v_dim))?;
        self.o.forward(&out)
    }

    /// Every head's keys `[batch, heads, len, nope + rope]` and values `[batch, heads, len,
    /// v_dim]` from the cached latents and rotated keys (transformers' `expand_kv`).
    fn expand(&self, latent: &Tensor, k_rot: &Tensor) -> Result<(Tensor, Tensor)> {
        let (batch, _, len, _) = latent.dims4()?;
        let (heads, nope) = (self.num_heads, self.nope_dim);
        let kv = self
            .kv_b
            .forward(latent)?
            .reshape((batch, len, heads, nope + self.v_dim))?
            .transpose(1, 2)?;
        let k_nope = kv.narrow(D::Minus1, 0, nope)?;
        let v = kv.narrow(D::Minus1, nope, self.v_dim)?.contiguous()?;
        let k_rot = k_rot.broadcast_as((batch, heads, len, self.rope_dim))?;
        let k = Tensor::cat(&[&k_nope, &k_rot.contiguous()?], D::Minus1)?;
        Ok((k, v))
    }
}
