//! Gemma 3 (text) on candle, from a GGUF with K-quants, written so that every value model-trace
//! annotates has a function or a `let` of its own:
//!
//! | annotation | site |
//! |------------|------|
//! | `#[trace_model(position = position, tokens = ids)]` | [`Model::forward_batch`]: the pass (every path's: a single prompt is a batch of one), with the token ids it runs, row after row |
//! | `#[trace_layer(index = self.index)]` | [`Block::forward`]; layer 0's input is the scaled embeddings |
//! | `trace_tensor!("attn_in" / "attn_out" / "attn_post_norm" / "resid_mid" / "mlp_in" / "mlp_out" / "mlp_post_norm")` | the `let`s of the same names in [`Block::forward`] |
//! | `trace_tensor!("q_norm" / "k_norm")` | [`Attention::forward`]: per head, `[batch, seq, heads, head_dim]` |
//! | `#[trace_attention]` | [`Attention::attention_probs`] |
//! | `#[trace_logits]` | [`OutputHead::logits`] |
//! | `trace_logits_value!(&lens, layer = i)` (logit lens) | `lens` in [`Model::forward`] |
//! | `#[trace_quant(reference = Self::forward_f32, quant = ..)]` | one site per type the file holds: Q4_K, Q5_0, Q6_K, Q8_0 |
//!
//! The block, as transformers' `Gemma3DecoderLayer` computes it:
//!
//! ```text
//! attn_in  = norm(x)                      resid_mid = x + attn_post_norm
//! attn_out = o(attention(attn_in))        mlp_in    = norm(resid_mid)
//! attn_post_norm = norm(attn_out)         mlp_out   = down(gelu_tanh(gate(mlp_in)) · up(mlp_in))
//!                                         output    = resid_mid + norm(mlp_out)
//! ```
//!
//! What differs from a Llama block, each a known porting bug ([`crate::bugs`]): the norms'
//! weights hold Gemma's `1 + w` already (the GGUF converter folds the `+1` in; transformers'
//! weights do not); the embeddings are scaled by `√hidden`; queries and keys are RMS-normed per
//! head before RoPE; five layers in six attend through a 512-key sliding window with RoPE base
//! 10,000, the sixth globally with the GGUF's base; the MLP's GELU is the tanh approximation;
//! RoPE rotates the two halves of each head (no permuted weights, unlike llama's GGUFs).
//!
//! A pass runs B rows side by side, left-padded ([`crate::rows`]): the stages' tensors are
//! `[batch, seq, ..]`, and row `r` of a stage read as a matrix is batch row `r / seq`, column
//! `r % seq`.
//!
//! Built without the `trace` feature the annotations are compiled out. Activations are f32 on
//! the CPU; the matmul weights stay quantized.

use crate::bugs::{self, Bug};
use crate::config::Config;
use crate::error::{Error, Result as LoadResult};
use crate::gguf::Gguf;
use crate::quant_linear::matmul_precision;
use crate::rows::{self, Rows};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, IndexOp, Result, Tensor};
use model_trace::{
    trace_attention, trace_layer, trace_logits, trace_logits_value, trace_model, trace_quant,
    trace_tensor, Precision,
};
use std::path::Path;
use std::sync::Arc;

pub use crate::quant_linear::QuantLinear;

/// The `#[trace_quant]` sites, one a format of Gemma 3 270M's Q4_K_M file.
impl QuantLinear {
    /// The quantized kernel through the site of its format (see [`QuantLinear::forward`]):
    /// dispatched by format because `#[trace_quant]` takes the format at compile time, so that
    /// each format's records carry the right label; any other format runs unrecorded rather
    /// than mislabelled.
    pub(crate) fn forward_quantized(&self, x: &Tensor) -> Result<Tensor> {
        match self.ggml_dtype() {
            GgmlDType::Q4K => self.forward_q4_k(x),
            GgmlDType::Q5_0 => self.forward_q5_0(x),
            GgmlDType::Q6K => self.forward_q6_k(x),
            GgmlDType::Q8_0 => self.forward_q8_0(x),
            _ => self.kernel(x),
        }
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q4_K, name = "q4_k_matmul")]
    fn forward_q4_k(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q5_0, name = "q5_0_matmul")]
    fn forward_q5_0(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q6_K, name = "q6_k_matmul")]
    fn forward_q6_k(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q8_0, name = "q8_0_matmul")]
    fn forward_q8_0(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }
}

/// Gemma's RMS norm, `x / rms(x) · (1 + w)`, over the last dimension. The GGUF stores `1 + w`.
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn load(gguf: &mut Gguf, name: &str, width: usize, eps: f32) -> LoadResult<Self> {
        let weight = gguf.qtensor(name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
        if weight.dims() != [width] {
            return Err(Error::Gguf(format!(
                "{name} has shape {:?}, expected [{width}]",
                weight.dims()
            )));
        }
        Ok(Self {
            weight,
            eps: f64::from(eps),
        })
    }

    /// The norm of `x` in `layer`, where the offset and epsilon bugs may be injected.
    pub fn forward(&self, x: &Tensor, layer: usize) -> Result<Tensor> {
        let weight = if bugs::injected_at(Bug::NormOffsetTwice, layer) {
            self.weight.affine(1.0, 1.0)?
        } else if bugs::injected_at(Bug::NormOffsetMissing, layer) {
            self.weight.affine(1.0, -1.0)?
        } else {
            self.weight.clone()
        };
        let eps = if bugs::injected_at(Bug::RmsEpsilon, layer) {
            bugs::LLAMA_RMS_EPS
        } else {
            self.eps as f32
        };
        candle_nn::ops::rms_norm(&x.contiguous()?, &weight, eps)
    }
}

/// The rotation tables of one RoPE base, for every position of the context.
struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl RopeTables {
    /// `cos` and `sin` `[context, head_dim / 2]` of base `theta`, positions divided by `scaling`.
    fn new(
        theta: f32,
        scaling: f32,
        head_dim: usize,
        context: usize,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32) / scaling)
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, context as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((context, 1))?;
        let angles = positions.matmul(&inv_freq)?;
        Ok(Self {
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }

    /// Fails unless the tables hold the positions below `end`.
    fn check_covers(&self, end: usize) -> Result<()> {
        let context = self.cos.dim(0)?;
        if end > context {
            candle_core::bail!(
                "rotary position {} past the context of {context} positions",
                end - 1
            );
        }
        Ok(())
    }

    /// `cos` and `sin` `[rows, seq_len, head_dim / 2]` of rows starting at `starts` (negative
    /// positions clamped to 0).
    fn rows(&self, starts: &[isize], seq_len: usize) -> Result<(Tensor, Tensor)> {
        let positions: Vec<u32> = starts
            .iter()
            .flat_map(|&start| (0..seq_len).map(move |i| (start + i as isize).max(0) as u32))
            .collect();
        let end = positions.iter().max().map_or(0, |&p| p as usize + 1);
        self.check_covers(end)?;
        let ids = Tensor::new(positions, self.cos.device())?;
        let half = self.cos.dim(1)?;
        let gather = |table: &Tensor| {
            table
                .index_select(&ids, 0)?
                .reshape((starts.len(), seq_len, half))
        };
        Ok((gather(&self.cos)?, gather(&self.sin)?))
    }
}

/// Rotary embeddings: the global layers' tables and the sliding-window layers', shared by all
/// layers.
pub struct Rotary {
    global: RopeTables,
    local: RopeTables,
}

impl Rotary {
    pub fn new(config: &Config, device: &Device) -> Result<Self> {
        let tables = |theta, scaling| {
            RopeTables::new(
                theta,
                scaling,
                config.head_dim,
                config.context_length,
                device,
            )
        };
        Ok(Self {
            global: tables(config.rope_theta, config.rope_scaling)?,
            local: tables(crate::config::LOCAL_ROPE_THETA, 1.0)?,
        })
    }

    /// Rotates `x: [batch, heads, seq, head_dim]` whose row `b` starts at rotary position
    /// `starts[b]`: the two halves of each head are the rotation's pairs (`rope`, not `rope_i`).
    /// A column before position 0 (left padding) is rotated as position 0.
    fn apply(&self, x: &Tensor, starts: &[isize], global: bool) -> Result<Tensor> {
        let tables = if global { &self.global } else { &self.local };
        let seq_len = x.dim(2)?;
        let (cos, sin) = match starts {
            // Every row at the same place, as a single prompt is: one table for all.
            [start, rest @ ..] if *start >= 0 && rest.iter().all(|s| s == start) => {
                let start = *start as usize;
                tables.check_covers(start + seq_len)?;
                (
                    tables.cos.narrow(0, start, seq_len)?,
                    tables.sin.narrow(0, start, seq_len)?,
                )
            }
            _ => tables.rows(starts, seq_len)?,
        };
        candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)
    }
}

/// One layer's keys and values, `[batch, kv_heads, len, head_dim]`, every position kept (the
/// sliding window is the mask's business).
pub struct KvCache {
    /// The block it belongs to (for the bug switches).
    layer: usize,
    keys: Option<Tensor>,
    values: Option<Tensor>,
    max_len: usize,
}

impl KvCache {
    /// An empty cache of block `layer` that refuses to grow past `max_len` positions.
    pub fn new(layer: usize, max_len: usize) -> Self {
        Self {
            layer,
            keys: None,
            values: None,
            max_len,
        }
    }

    /// Appends `k`, `v` (`[batch, kv_heads, new, head_dim]`) and returns every cached position,
    /// the new ones included: those of earlier passes as the cache stores them, this pass's as
    /// given.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (cached, new) = (self.len(), k.dim(2)?);
        if cached + new > self.max_len {
            candle_core::bail!(
                "KV cache full: {cached} cached + {new} new positions exceed the context of {}",
                self.max_len
            );
        }
        // `kv-cache-off-by-one`: a decode step written over the position before its own.
        let one_early =
            bugs::injected_at(Bug::KvCacheOffByOne, self.layer) && new == 1 && cached > 0;
        let keys = join(self.keys.as_ref(), k, one_early)?;
        let values = join(self.values.as_ref(), v, one_early)?;
        match self.stored_dtype() {
            Some(dtype) => {
                let rounded = |t: &Tensor| t.to_dtype(dtype)?.to_dtype(DType::F32);
                self.keys = Some(join(self.keys.as_ref(), &rounded(k)?, one_early)?);
                self.values = Some(join(self.values.as_ref(), &rounded(v)?, one_early)?);
            }
            None => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        Ok((keys, values))
    }

    /// The dtype the cache rounds what it stores to, where a `kv-cache-f16`/`-bf16` bug asks.
    fn stored_dtype(&self) -> Option<DType> {
        if bugs::injected_at(Bug::KvCacheF16, self.layer) {
            Some(DType::F16)
        } else if bugs::injected_at(Bug::KvCacheBf16, self.layer) {
            Some(DType::BF16)
        } else {
            None
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.keys
            .as_ref()
            .map_or(0, |k| k.dim(2).unwrap_or_default())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.keys = None;
        self.values = None;
    }
}

/// `cached` followed by `new` along the positions (dimension 2). With `one_early`, `new` (one
/// position) lands on the last cached position and a zero position follows it: what a cache
/// that writes a decode step at `len - 1` and then counts `len + 1` positions holds.
fn join(cached: Option<&Tensor>, new: &Tensor, one_early: bool) -> Result<Tensor> {
    match cached {
        None => new.contiguous(),
        Some(cached) if one_early => {
            let kept = cached.narrow(2, 0, cached.dim(2)? - 1)?;
            Tensor::cat(&[&kept, new, &new.zeros_like()?], 2)?.contiguous()
        }
        Some(cached) => Tensor::cat(&[cached, new], 2)?.contiguous(),
    }
}

pub struct Attention {
    /// The block it belongs to (for its window and the bug switches).
    index: usize,
    q: QuantLinear,
    k: QuantLinear,
    v: QuantLinear,
    o: QuantLinear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Whether this layer attends globally (else through the sliding window).
    global: bool,
    sliding_window: usize,
    scale: f64,
    rotary: Arc<Rotary>,
}

impl Attention {
    /// `x: [batch, seq, hidden]`, the columns `rows` places -> `[batch, seq, heads · head_dim]`
    /// projected back to `hidden`.
    pub fn forward(&self, x: &Tensor, rows: Rows<'_>, cache: &mut KvCache) -> Result<Tensor> {
        let (batch, seq_len, _) = x.dims3()?;
        let q = self
            .q
            .forward(x)?
            .reshape((batch, seq_len, self.num_heads, self.head_dim))?;
        let k = self
            .k
            .forward(x)?
            .reshape((batch, seq_len, self.num_kv_heads, self.head_dim))?;
        let v = self
            .v
            .forward(x)?
            .reshape((batch, seq_len, self.num_kv_heads, self.head_dim))?
            .transpose(1, 2)?;
        let (q_norm, k_norm) = if bugs::injected_at(Bug::QkNormSkipped, self.index) {
            (q, k)
        } else {
            (
                self.q_norm.forward(&q, self.index)?,
                self.k_norm.forward(&k, self.index)?,
            )
        };
        trace_tensor!("q_norm", &q_norm);
        trace_tensor!("k_norm", &k_norm);
        let global_rope = self.global || bugs::injected_at(Bug::RopeBaseGlobal, self.index);
        let starts = self.rotary_starts(rows, seq_len);
        let q = self
            .rotary
            .apply(&q_norm.transpose(1, 2)?, &starts, global_rope)?;
        let k = self
            .rotary
            .apply(&k_norm.transpose(1, 2)?, &starts, global_rope)?;
        let (k, v) = cache.append(&k, &v)?;

        let probs = self.attention_probs(&q, &k, rows)?;
        // Query heads that share a KV head are stacked along the row axis, so that one batched
        // matmul serves the group without copying K/V once per query head.
        let group = self.num_heads / self.num_kv_heads;
        let k_len = k.dim(2)?;
        let grouped = probs.reshape((batch, self.num_kv_heads, group * seq_len, k_len))?;
        let out = grouped
            .matmul(&v)?
            .reshape((batch, self.num_heads, seq_len, self.head_dim))?
            .transpose(1, 2)?
            .reshape((batch, seq_len, self.num_heads * self.head_dim))?;
        self.o.forward(&out)
    }

    /// Each row's rotary position at its first column in a pass of `seq_len` columns, with the
    /// rotary bugs of this layer injected.
    fn rotary_starts(&self, rows: Rows<'_>, seq_len: usize) -> Vec<isize> {
        let at = |bug| bugs::injected_at(bug, self.index);
        let first = rows.first_column as isize;
        let decode = rows.is_decode(seq_len);
        let shift = if decode && at(Bug::RopeDecodePositionMissing) {
            -first
        } else if decode && at(Bug::RopeDecodePositionTwice) {
            first
        } else {
            0
        };
        let padding_ignored = at(Bug::BatchRopeIgnoresPadding);
        rows.rotary_starts()
            .into_iter()
            .zip(rows.pads)
            .map(|(start, &pad)| start + shift + if padding_ignored { pad as isize } else { 0 })
            .collect()
    }

    /// Softmax attention probabilities `[batch, heads, q_len, k_len]` of the rotated queries
    /// `q: [batch, heads, q_len, head_dim]` over the cached keys `k: [batch, kv_heads, k_len,
    /// head_dim]`: causal, blind to each row's padding (`rows`), and in a sliding-window layer
    /// limited to the window's last keys.
    #[trace_attention]
    pub fn attention_probs(&self, q: &Tensor, k: &Tensor, rows: Rows<'_>) -> Result<Tensor> {
        let (batch, _, q_len, head_dim) = q.dims4()?;
        let k_len = k.dim(2)?;
        let group = self.num_heads / self.num_kv_heads;
        // Query head h reads KV head h / group, as in transformers' `repeat_kv`.
        let q = q.reshape((batch, self.num_kv_heads, group * q_len, head_dim))?;
        let scores =
            (q.matmul(&k.t()?)? * self.scale)?.reshape((batch, self.num_heads, q_len, k_len))?;
        let pads = self.mask_pads(rows);
        let window = self.window(rows.is_decode(q_len));
        let scores = match rows::mask(rows.first_column, q_len, k_len, window, &pads, q.device())? {
            Some(mask) => scores.broadcast_add(&mask)?,
            None => scores,
        };
        candle_nn::ops::softmax_last_dim(&scores)
    }

    /// How many keys back a query of this layer sees (`None`: all), in a decode step or not,
    /// with the window bugs of this layer injected.
    fn window(&self, decode: bool) -> Option<usize> {
        let at = |bug| bugs::injected_at(bug, self.index);
        match self.global {
            true => None,
            false if at(Bug::WindowOneTooWide) => Some(self.sliding_window + 1),
            false if decode && at(Bug::WindowDecodeOneShort) => Some(self.sliding_window - 1),
            false => Some(self.sliding_window),
        }
    }

    /// The padding each row's mask is built from: the row's own, or with
    /// `batch-mask-other-row` the next row's.
    fn mask_pads(&self, rows: Rows<'_>) -> Vec<usize> {
        if !bugs::injected_at(Bug::BatchMaskOtherRow, self.index) {
            return rows.pads.to_vec();
        }
        let count = rows.count();
        (0..count).map(|b| rows.pads[(b + 1) % count]).collect()
    }
}

pub struct Mlp {
    /// The block it belongs to (for the bug switch).
    index: usize,
    gate: QuantLinear,
    up: QuantLinear,
    down: QuantLinear,
}

impl Mlp {
    /// GeGLU: `down(gelu_tanh(gate(x)) · up(x))`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate.forward(x)?;
        let gate = if bugs::injected_at(Bug::GeluExact, self.index) {
            gate.gelu_erf()?
        } else {
            // candle's `gelu` is the tanh approximation (transformers' `gelu_pytorch_tanh`).
            gate.gelu()?
        };
        self.down.forward(&(gate * self.up.forward(x)?)?)
    }
}

pub struct Block {
    /// The block's place in the model, 0 for the first: its layer index in traces.
    index: usize,
    attn_norm: RmsNorm,
    attn: Attention,
    attn_post_norm: RmsNorm,
    mlp_norm: RmsNorm,
    mlp: Mlp,
    mlp_post_norm: RmsNorm,
}

impl Block {
    /// One Gemma 3 block over `x: [batch, seq, hidden]`, the columns `rows` places; returns the
    /// residual stream after the block. Its stages are the `let`s of the same names (the
    /// meanings of `model_trace::Stage`), and `q_norm`, `k_norm` in the attention.
    #[trace_layer(index = self.index)]
    pub fn forward(&self, x: &Tensor, rows: Rows<'_>, cache: &mut KvCache) -> Result<Tensor> {
        let attn_in = self.attn_norm.forward(x, self.index)?;
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attn.forward(&attn_in, rows, cache)?;
        trace_tensor!("attn_out", &attn_out);
        let attn_post_norm = self.attn_post_norm.forward(&attn_out, self.index)?;
        trace_tensor!("attn_post_norm", &attn_post_norm);
        let resid_mid = (x + &attn_post_norm)?;
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = self.mlp_norm.forward(&resid_mid, self.index)?;
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = self.mlp.forward(&mlp_in)?;
        trace_tensor!("mlp_out", &mlp_out);
        let mlp_post_norm = self.mlp_post_norm.forward(&mlp_out, self.index)?;
        trace_tensor!("mlp_post_norm", &mlp_post_norm);
        &resid_mid + &mlp_post_norm
    }

    /// The block's place in the model, 0 for the first.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the block attends globally (else through the sliding window).
    pub fn is_global(&self) -> bool {
        self.attn.global
    }
}

/// The final norm and the output head (tied to the token embeddings).
pub struct OutputHead {
    /// The layer index of the final norm for the bug switches: one past the last block.
    index: usize,
    norm: RmsNorm,
    head: QuantLinear,
}

impl OutputHead {
    /// `hidden: [batch, hidden] -> [batch, vocab]`. Recorded as the layer one past the highest
    /// layer index of the pass (18 after Gemma 3 270M's 18 blocks).
    #[trace_logits]
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.project(hidden)
    }

    /// What [`OutputHead::logits`] computes, without being the final head: the logit lens reads
    /// every layer through it.
    fn project(&self, hidden: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.norm.forward(hidden, self.index)?)
    }
}

pub struct Model {
    config: Config,
    /// The token embeddings, quantized (Q8_0 in 270M's file): rows are dequantized as looked up.
    embeddings: Arc<QTensor>,
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    output: OutputHead,
    /// When on, each block's output at the last position also goes through the final norm and
    /// the head (the logit lens). Off by default: it costs one head matmul per layer.
    pub logit_lens: bool,
    lens: Vec<Tensor>,
}

impl Model {
    /// Loads the model from a GGUF file onto the CPU.
    pub fn load(path: &Path) -> LoadResult<Self> {
        let mut gguf = Gguf::open(path)?;
        Self::from_gguf(&mut gguf)
    }

    pub fn from_gguf(gguf: &mut Gguf) -> LoadResult<Self> {
        let device = Device::Cpu;
        let config = Config::from_gguf(gguf)?;
        let rotary = Arc::new(Rotary::new(&config, &device)?);
        let eps = config.rms_norm_eps;
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let mut linear = |name: &str| -> LoadResult<QuantLinear> {
                let name = format!("blk.{i}.{name}.weight");
                let weight = Arc::new(gguf.qtensor(&name, &device)?);
                Ok(QuantLinear::new(name, weight)?)
            };
            let attn = Attention {
                index: i,
                q: linear("attn_q")?,
                k: linear("attn_k")?,
                v: linear("attn_v")?,
                o: linear("attn_output")?,
                q_norm: RmsNorm::load(
                    gguf,
                    &format!("blk.{i}.attn_q_norm.weight"),
                    config.head_dim,
                    eps,
                )?,
                k_norm: RmsNorm::load(
                    gguf,
                    &format!("blk.{i}.attn_k_norm.weight"),
                    config.head_dim,
                    eps,
                )?,
                num_heads: config.num_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
                global: config.is_global(i),
                sliding_window: config.sliding_window,
                scale: config.attention_scale(),
                rotary: rotary.clone(),
            };
            let mut linear = |name: &str| -> LoadResult<QuantLinear> {
                let name = format!("blk.{i}.{name}.weight");
                let weight = Arc::new(gguf.qtensor(&name, &device)?);
                Ok(QuantLinear::new(name, weight)?)
            };
            let mlp = Mlp {
                index: i,
                gate: linear("ffn_gate")?,
                up: linear("ffn_up")?,
                down: linear("ffn_down")?,
            };
            let mut norm = |name: &str| {
                RmsNorm::load(
                    gguf,
                    &format!("blk.{i}.{name}.weight"),
                    config.hidden_size,
                    eps,
                )
            };
            blocks.push(Block {
                index: i,
                attn_norm: norm("attn_norm")?,
                attn,
                attn_post_norm: norm("post_attention_norm")?,
                mlp_norm: norm("ffn_norm")?,
                mlp,
                mlp_post_norm: norm("post_ffw_norm")?,
            });
        }
        let embeddings = Arc::new(gguf.qtensor("token_embd.weight", &device)?);
        let head = if gguf.has_tensor("output.weight") {
            let weight = Arc::new(gguf.qtensor("output.weight", &device)?);
            QuantLinear::new("output.weight", weight)?
        } else {
            QuantLinear::new("token_embd.weight", embeddings.clone())?
        };
        let norm = RmsNorm::load(gguf, "output_norm.weight", config.hidden_size, eps)?;
        let caches = (0..config.num_layers)
            .map(|layer| KvCache::new(layer, config.context_length))
            .collect();
        Ok(Self {
            output: OutputHead {
                index: config.num_layers,
                norm,
                head,
            },
            config,
            embeddings,
            blocks,
            caches,
            logit_lens: false,
            lens: Vec::new(),
        })
    }

    /// Runs `tokens`, the sequence's tokens from `position` on, and returns the logits `[vocab]`
    /// for the token after the last one: [`Model::forward_batch`] on one row without padding.
    ///
    /// `position == 0` starts a new sequence (the KV caches are cleared); otherwise `position`
    /// must equal the number of positions already cached.
    pub fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor> {
        self.forward_batch(tokens, &[0], position)?.squeeze(0)
    }

    /// One pass over a batch: `ids` holds `pads.len()` rows of the same number of columns, one
    /// row after another, from column `position` on; row `b` is left-padded by `pads[b]`
    /// columns (its ids there mean nothing: [`crate::rows`]). Returns the logits `[rows,
    /// vocab]` for the token after each row's last column.
    ///
    /// `position == 0` starts new sequences (the KV caches are cleared); otherwise `position`
    /// must equal the number of columns already cached, and `pads` be the same as then. Every
    /// pass of every path goes through here: it is the traced pass, whose `tokens` are `ids`.
    #[trace_model(position = position, tokens = ids)]
    pub fn forward_batch(
        &mut self,
        ids: &[u32],
        pads: &[usize],
        position: usize,
    ) -> Result<Tensor> {
        let rows = Rows {
            first_column: position,
            pads,
        };
        let seq_len = check_rows(ids, rows)?;
        if position == 0 {
            self.caches.iter_mut().for_each(KvCache::clear);
        }
        let cached = self.caches.first().map_or(0, KvCache::len);
        if cached != position {
            candle_core::bail!("forward at position {position}, but {cached} positions are cached");
        }
        let mut x = self.embed(ids, rows.count(), seq_len)?;
        self.lens.clear();
        for i in 0..self.blocks.len() {
            x = self.blocks[i].forward(&x, rows, &mut self.caches[i])?;
            if self.logit_lens {
                // Block i's output read as a prediction. Not `logits`: that is the final head's
                // own tracepoint, recorded as the layer after the last block.
                let lens = self.output.project(&last_position(&x)?)?;
                trace_logits_value!(&lens, layer = i);
                self.lens.push(lens);
            }
        }
        self.output.logits(&last_position(&x)?)
    }

    /// The embeddings of `ids` as the first block reads them, `[rows, seq_len, hidden]`: the
    /// rows of the token embeddings scaled by `√hidden`.
    fn embed(&self, ids: &[u32], rows: usize, seq_len: usize) -> Result<Tensor> {
        let ids = Tensor::new(ids, &Device::Cpu)?;
        let hidden = self.config.hidden_size;
        let embedded = self
            .embeddings
            .embedding(&ids)?
            .reshape((rows, seq_len, hidden))?;
        if bugs::injected(Bug::EmbeddingUnscaled) {
            return Ok(embedded);
        }
        embedded * f64::from(self.config.embedding_scale())
    }

    /// The logit lens of the last forward pass: one `[vocab]` tensor per layer, empty unless
    /// `logit_lens` was on.
    pub fn lens_logits(&self) -> Result<Vec<Tensor>> {
        self.lens.iter().map(|l| l.squeeze(0)).collect()
    }

    pub fn clear_cache(&mut self) {
        self.caches.iter_mut().for_each(KvCache::clear);
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Runs every matmul on its dequantized f32 weight from now on
    /// ([`QuantLinear::dequantize`]): the relations between passes (one prefill against a
    /// prefill and decode steps, chunks, a batch) then hold to f32 rounding, where the 8-bit
    /// rounding of each quantized matmul's input turns a kernel's rounding difference between
    /// one row and many into a quantization step now and then.
    pub fn dequantize_matmuls(&mut self) -> Result<()> {
        for block in &mut self.blocks {
            let (attn, mlp) = (&mut block.attn, &mut block.mlp);
            for linear in [
                &mut attn.q,
                &mut attn.k,
                &mut attn.v,
                &mut attn.o,
                &mut mlp.gate,
                &mut mlp.up,
                &mut mlp.down,
            ] {
                linear.dequantize()?;
            }
        }
        self.output.head.dequantize()
    }

    /// What the model computes in, for the trace header
    /// ([`model_trace::SessionBuilder::precision`]): the matmul weights' types as loaded
    /// ([`matmul_precision`]: the file's, or F32 where `--dequantize`
    /// ([`dequantize_matmuls`](Self::dequantize_matmuls)) or candle's `CANDLE_DEQUANTIZE_ALL`
    /// dequantized them), the tied Q8_0 head among them; f32 activations and KV cache. The token
    /// embeddings are rows of the file's Q8_0 table dequantized to f32 as they are looked up,
    /// whatever the mode: a lookup of exact values, not a matmul, so not in `weights`.
    pub fn precision(&self) -> Precision {
        matmul_precision(self.quant_linears())
            .activations("F32")
            .kv_cache("F32")
    }

    /// Every quantized matmul, in execution order within a block, the head last.
    pub fn quant_linears(&self) -> Vec<&QuantLinear> {
        let mut all: Vec<&QuantLinear> = Vec::with_capacity(self.blocks.len() * 7 + 1);
        for block in &self.blocks {
            let (attn, mlp) = (&block.attn, &block.mlp);
            all.extend([
                &attn.q, &attn.k, &attn.v, &attn.o, &mlp.gate, &mlp.up, &mlp.down,
            ]);
        }
        all.push(&self.output.head);
        all
    }
}

/// The columns of each row of a pass (`ids` split into `rows.count()` rows), or why the ids and
/// the padding do not make one.
fn check_rows(ids: &[u32], rows: Rows<'_>) -> Result<usize> {
    let count = rows.count();
    if ids.is_empty() || count == 0 || !ids.len().is_multiple_of(count) {
        candle_core::bail!(
            "a pass needs the same number of ids (at least one) in each of its rows: {} ids in {count} rows",
            ids.len()
        );
    }
    let columns = rows.first_column + ids.len() / count;
    if let Some((row, pad)) = rows
        .pads
        .iter()
        .enumerate()
        .find(|(_, &pad)| pad >= columns)
    {
        candle_core::bail!(
            "row {row}'s padding of {pad} columns leaves none of its {columns} columns to a token"
        );
    }
    Ok(ids.len() / count)
}

/// `[batch, seq, hidden] -> [batch, hidden]` at the last position.
fn last_position(x: &Tensor) -> Result<Tensor> {
    let seq_len = x.dim(1)?;
    x.i((.., seq_len - 1, ..))?.contiguous()
}

/// Index of the largest logit; the first one on ties.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    let values = logits
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    Ok(best as u32)
}
