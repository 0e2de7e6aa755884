//! A llama decoder (SmolLM2-135M) on candle, written so that every value model-trace annotates has a
//! function or a `let` of its own:
//!
//! | annotation                                | site                                   |
//! |-------------------------------------------|----------------------------------------|
//! | `#[trace_model(position = position, tokens = batch.ids(), name = "forward")]` | [`Model::forward_batch`]: the pass, with the token ids it runs (a batch's rows one after another) |
//! | `#[trace_layer(index = self.index)]`      | [`Block::forward`]                     |
//! | `trace_tensor!("attn_in" / "attn_out" / "resid_mid" / "mlp_in" / "mlp_out")` | the `let`s of the same names in [`Block::forward`] (the stage vocabulary of `model_trace::Stage`) |
//! | `#[trace_attention]`                      | [`Attention::attention_probs`]         |
//! | `#[trace_logits]`                         | [`OutputHead::logits`]                 |
//! | `trace_logits_value!(&lens, layer = i)` (logit lens) | `lens` in [`Model::forward`] |
//! | `#[trace_kv_cache]`                       | [`KvCache::append`]: each layer's cache, once per forward pass |
//! | `#[trace_quant(reference = Self::forward_f32, quant = ..)]` | `QuantLinear::forward_q4_1` / `forward_q8_0` |
//!
//! Run cut into pipeline stages ([`crate::pipeline`]), each stage's forward function is annotated
//! `#[trace_model(position = position, name = "stage")]` in place of [`Model::forward`]; the
//! other sites are the same.
//!
//! Built without the `trace` feature the annotations are compiled out.
//! Everything computes in f32 on the CPU; only the matmul weights stay quantized.

use crate::batch::{Batch, Columns};
use crate::bugs::{self, Bug};
use crate::error::{Error, Result as LoadResult};
use crate::gguf::Gguf;
use crate::quant_linear::matmul_precision;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, IndexOp, Result, Tensor};
use model_trace::{
    trace_attention, trace_kv_cache, trace_layer, trace_logits, trace_logits_value, trace_model,
    trace_quant, trace_tensor, Precision,
};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Hyper-parameters, all read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub context_length: usize,
}

impl Config {
    pub fn from_gguf(gguf: &Gguf) -> LoadResult<Self> {
        let arch = gguf.string("general.architecture")?;
        if arch != "llama" {
            return Err(Error::Gguf(format!(
                "general.architecture is {arch:?}; this is a llama implementation"
            )));
        }
        let hidden_size = gguf.usize("llama.embedding_length")?;
        let num_heads = gguf.usize("llama.attention.head_count")?;
        let num_kv_heads = gguf.usize("llama.attention.head_count_kv")?;
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::Gguf(format!(
                "{num_heads} query heads cannot share {num_kv_heads} KV heads evenly"
            )));
        }
        if hidden_size % num_heads != 0 {
            return Err(Error::Gguf(format!(
                "width {hidden_size} is not a multiple of {num_heads} heads"
            )));
        }
        let head_dim = hidden_size / num_heads;
        // Partial rotary embeddings are not implemented; refuse rather than compute garbage.
        if let Ok(rope_dim) = gguf.usize("llama.rope.dimension_count") {
            if rope_dim != head_dim {
                return Err(Error::Gguf(format!(
                    "llama.rope.dimension_count is {rope_dim}, head dim is {head_dim}; \
                     partial rotary embeddings are not implemented"
                )));
            }
        }
        let vocab_size = match gguf.usize("llama.vocab_size") {
            Ok(n) => n,
            Err(_) => gguf.strings("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size: gguf.usize("llama.feed_forward_length")?,
            num_layers: gguf.usize("llama.block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta: gguf.f32("llama.rope.freq_base").unwrap_or(10_000.0),
            rms_norm_eps: gguf.f32("llama.attention.layer_norm_rms_epsilon")?,
            context_length: gguf.usize("llama.context_length")?,
        })
    }
}

pub use crate::quant_linear::QuantLinear;

/// The `#[trace_quant]` sites: SmolLM2's blocks are Q4_1 and its tied head Q8_0.
impl QuantLinear {
    /// The quantized kernel through the site of its format (see [`QuantLinear::forward`]):
    /// dispatched by format because `#[trace_quant]` takes the format at compile time, so that
    /// each format's records carry the right label; any other format runs unrecorded rather
    /// than mislabelled.
    pub(crate) fn forward_quantized(&self, x: &Tensor) -> Result<Tensor> {
        match self.ggml_dtype() {
            GgmlDType::Q4_1 => self.forward_q4_1(x),
            GgmlDType::Q8_0 => self.forward_q8_0(x),
            _ => self.kernel(x),
        }
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q4_1, name = "q4_1_matmul")]
    fn forward_q4_1(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q8_0, name = "q8_0_matmul")]
    fn forward_q8_0(&self, x: &Tensor) -> Result<Tensor> {
        self.kernel(x)
    }
}

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
    /// The epsilon of [`Bug::RmsEpsilon`]: the neighbouring GGUF key's value
    /// (`llama.attention.head_count_kv`, 3 for SmolLM2-135M) read in its place.
    misread_eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }

    /// [`forward`](Self::forward), or with the misread epsilon of [`Bug::RmsEpsilon`] when it
    /// is injected in `layer`.
    fn forward_in(&self, x: &Tensor, layer: usize) -> Result<Tensor> {
        if bugs::injected_at(Bug::RmsEpsilon, layer) {
            return candle_nn::ops::rms_norm(x, &self.weight, self.misread_eps);
        }
        if bugs::injected_at(Bug::RmsSumReassociated, layer) {
            return self.forward_sum_halves(x);
        }
        self.forward(x)
    }

    /// [`forward`](Self::forward) as candle computes it on the CPU, but for the sum of squares
    /// of each row, taken as the sum of its two halves' sums ([`Bug::RmsSumReassociated`]).
    fn forward_sum_halves(&self, x: &Tensor) -> Result<Tensor> {
        let values = x.flatten_all()?.to_vec1::<f32>()?;
        let alpha = self.weight.to_vec1::<f32>()?;
        let n = alpha.len();
        let mut out = Vec::with_capacity(values.len());
        for row in values.chunks_exact(n) {
            let (first, second) = row.split_at(n / 2);
            let half = |part: &[f32]| part.iter().map(|v| v * v).sum::<f32>();
            let m = ((half(first) + half(second)) / n as f32 + self.eps).sqrt();
            out.extend(row.iter().zip(&alpha).map(|(s, a)| s / m * a));
        }
        Tensor::from_vec(out, x.shape(), x.device())
    }
}

/// Rotary tables for every position of the context, computed once and shared by all layers.
///
/// llama.cpp's converter permutes the q/k weights of llama models so that rotation pairs are
/// adjacent (dims 2i, 2i+1), hence the interleaved `rope_i`, not the half-split `rope`.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
    /// The tables of [`Bug::RopeBase`], made when a layer first asks for them.
    wrong_base: OnceLock<(Tensor, Tensor)>,
    head_dim: usize,
    context_length: usize,
}

impl Rotary {
    pub fn new(config: &Config, device: &Device) -> Result<Self> {
        let (cos, sin) = Self::tables(
            config.rope_theta,
            config.head_dim,
            config.context_length,
            device,
        )?;
        Ok(Self {
            cos,
            sin,
            wrong_base: OnceLock::new(),
            head_dim: config.head_dim,
            context_length: config.context_length,
        })
    }

    /// `cos` and `sin` `[context, head_dim / 2]` of the rotation angles of base `theta`.
    fn tables(
        theta: f32,
        head_dim: usize,
        context: usize,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, context as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((context, 1))?;
        let angles = positions.matmul(&inv_freq)?;
        Ok((angles.cos()?, angles.sin()?))
    }

    /// Rotates `x: [batch, heads, seq, head_dim]`, the pass's `columns` of each row, in `layer`
    /// (where a bug may be injected): row `b`'s column `c` at position `c - padding[b]`.
    pub fn apply(&self, x: &Tensor, columns: Columns<'_>, layer: usize) -> Result<Tensor> {
        let seq_len = x.dim(2)?;
        let (cos, sin) = self.tables_in(layer, x.device())?;
        let offset = Self::offset(columns, seq_len, layer);
        let (cos, sin) =
            if columns.is_padded() && !bugs::injected_at(Bug::BatchRopeIgnoresPadding, layer) {
                // Each row at positions of its own: `[batch, seq, head_dim / 2]` tables.
                let positions = columns.rotary_positions(offset, seq_len);
                let positions = Tensor::new(positions.as_slice(), x.device())?;
                let shape = (columns.padding.len(), seq_len, self.head_dim / 2);
                (
                    cos.index_select(&positions, 0)?.reshape(shape)?,
                    sin.index_select(&positions, 0)?.reshape(shape)?,
                )
            } else {
                (
                    cos.narrow(0, offset, seq_len)?,
                    sin.narrow(0, offset, seq_len)?,
                )
            };
        if bugs::injected_at(Bug::RopeHalfSplit, layer) {
            return candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin);
        }
        candle_nn::rotary_emb::rope_i(&x.contiguous()?, &cos, &sin)
    }

    /// The `cos` and `sin` tables of `layer`: the model's, or those of [`Bug::RopeBase`].
    fn tables_in(&self, layer: usize, device: &Device) -> Result<(&Tensor, &Tensor)> {
        if !bugs::injected_at(Bug::RopeBase, layer) {
            return Ok((&self.cos, &self.sin));
        }
        let (cos, sin) = match self.wrong_base.get() {
            Some(tables) => tables,
            None => {
                let tables = Self::tables(10_000.0, self.head_dim, self.context_length, device)?;
                self.wrong_base.get_or_init(|| tables)
            }
        };
        Ok((cos, sin))
    }

    /// The position the pass's first column is rotated at (before a row's padding is taken
    /// off): its column, `columns.start`, but for a decode step (one column after the first)
    /// with [`Bug::RopeDecodePositionMissing`] (0) or [`Bug::RopeDecodePositionTwice`] (twice).
    fn offset(columns: Columns<'_>, seq_len: usize, layer: usize) -> usize {
        let decode = seq_len == 1 && columns.start > 0;
        if decode && bugs::injected_at(Bug::RopeDecodePositionMissing, layer) {
            0
        } else if decode && bugs::injected_at(Bug::RopeDecodePositionTwice, layer) {
            2 * columns.start
        } else {
            columns.start
        }
    }
}

/// One layer's keys and values, `[batch, kv_heads, len, head_dim]`, in a buffer that doubles when
/// full: appending one token copies one row, not the whole history.
pub struct KvCache {
    /// The layer it belongs to (for the bug switch).
    layer: usize,
    keys: Option<Tensor>,
    values: Option<Tensor>,
    len: usize,
    capacity: usize,
    max_len: usize,
    /// The positions the last append wrote, still at full precision: a rounding cache
    /// ([`Bug::KvCacheF16`], [`Bug::KvCacheBf16`]) rounds them before the next pass reads them.
    fresh: Range<usize>,
}

impl KvCache {
    /// Rows allocated at the first append (or the prompt length, if larger).
    const INITIAL_CAPACITY: usize = 64;

    /// An empty cache of `layer` that refuses to grow past `max_len` positions (the model's
    /// context).
    pub fn new(layer: usize, max_len: usize) -> Self {
        Self {
            layer,
            keys: None,
            values: None,
            len: 0,
            capacity: 0,
            max_len,
            fresh: 0..0,
        }
    }

    /// Appends `k`, `v` (`[batch, kv_heads, new, head_dim]`) and returns every cached position,
    /// the new ones included. Traced as one step of this layer's cache (the enclosing layer).
    #[trace_kv_cache(len = self.len, capacity = self.capacity, bytes = self.bytes())]
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let new = k.dim(2)?;
        let needed = self.len + new;
        if needed > self.max_len {
            candle_core::bail!(
                "KV cache full: {} cached + {new} new positions exceed the context of {}",
                self.len,
                self.max_len
            );
        }
        if needed > self.capacity {
            let capacity = needed
                .max(Self::INITIAL_CAPACITY)
                .max(self.capacity * 2)
                .min(self.max_len);
            self.keys = Some(Self::grow(self.keys.as_ref(), k, self.len, capacity)?);
            self.values = Some(Self::grow(self.values.as_ref(), v, self.len, capacity)?);
            self.capacity = capacity;
        }
        let (keys, values) = match (&self.keys, &self.values) {
            (Some(keys), Some(values)) => (keys, values),
            _ => candle_core::bail!("KV cache buffers missing after growth"),
        };
        if let Some(dtype) = self.rounding() {
            for buffer in [keys, values] {
                round_in_place(buffer, self.fresh.clone(), dtype)?;
            }
        }
        let at = if bugs::injected_at(Bug::KvCacheOffByOne, self.layer) && new == 1 && self.len > 0
        {
            self.len - 1
        } else {
            self.len
        };
        keys.slice_set(&k.contiguous()?, 2, at)?;
        values.slice_set(&v.contiguous()?, 2, at)?;
        self.fresh = at..at + new;
        self.len = needed;
        Ok((keys.narrow(2, 0, self.len)?, values.narrow(2, 0, self.len)?))
    }

    /// The type the cache rounds what it keeps to ([`Bug::KvCacheF16`], [`Bug::KvCacheBf16`]);
    /// `None` for a cache that keeps f32.
    fn rounding(&self) -> Option<DType> {
        if bugs::injected_at(Bug::KvCacheF16, self.layer) {
            Some(DType::F16)
        } else if bugs::injected_at(Bug::KvCacheBf16, self.layer) {
            Some(DType::BF16)
        } else {
            None
        }
    }

    /// A zeroed buffer of `capacity` positions shaped like `like`, holding the first `len`
    /// positions of `old`.
    fn grow(old: Option<&Tensor>, like: &Tensor, len: usize, capacity: usize) -> Result<Tensor> {
        let (batch, heads, _, head_dim) = like.dims4()?;
        let buffer = Tensor::zeros(
            (batch, heads, capacity, head_dim),
            like.dtype(),
            like.device(),
        )?;
        if let Some(old) = old {
            if len > 0 {
                buffer.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
            }
        }
        Ok(buffer)
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the current buffers can hold before they grow again.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes allocated for keys and values (the whole capacity, not just the filled part).
    pub fn bytes(&self) -> usize {
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Forgets every position; the buffers are released too.
    pub fn clear(&mut self) {
        *self = Self::new(self.layer, self.max_len);
    }
}

/// Rounds `positions` of `buffer` (`[batch, heads, len, head_dim]`) to `dtype` and back.
fn round_in_place(buffer: &Tensor, positions: Range<usize>, dtype: DType) -> Result<()> {
    if positions.is_empty() {
        return Ok(());
    }
    let part = buffer.narrow(2, positions.start, positions.len())?;
    let rounded = part.to_dtype(dtype)?.to_dtype(buffer.dtype())?;
    buffer.slice_set(&rounded, 2, positions.start)
}

pub struct Attention {
    /// The block it belongs to (for the bug switch).
    index: usize,
    q: QuantLinear,
    k: QuantLinear,
    v: QuantLinear,
    o: QuantLinear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    rotary: Arc<Rotary>,
}

impl Attention {
    /// `x: [batch, seq, hidden]`, the pass's `columns` of each row -> `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Tensor, columns: Columns<'_>, cache: &mut KvCache) -> Result<Tensor> {
        let (batch, seq_len, hidden) = x.dims3()?;
        let heads = |t: Tensor, n: usize| -> Result<Tensor> {
            t.reshape((batch, seq_len, n, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = heads(self.q.forward(x)?, self.num_heads)?;
        let k = heads(self.k.forward(x)?, self.num_kv_heads)?;
        let v = heads(self.v.forward(x)?, self.num_kv_heads)?;
        let q = self.rotary.apply(&q, columns, self.index)?;
        let k = self.rotary.apply(&k, columns, self.index)?;
        let (k, v) = cache.append(&k, &v)?;

        let probs = self.attention_probs(&q, &k, columns)?;
        // Query heads that share a KV head are stacked along the row axis so one batched matmul
        // serves the group without copying K/V once per query head.
        let group = self.num_heads / self.num_kv_heads;
        let k_len = k.dim(2)?;
        let grouped = probs.reshape((batch, self.num_kv_heads, group * seq_len, k_len))?;
        let out = grouped
            .matmul(&v.contiguous()?)?
            .reshape((batch, self.num_heads, seq_len, self.head_dim))?
            .transpose(1, 2)?
            .reshape((batch, seq_len, hidden))?;
        self.o.forward(&out)
    }

    /// Softmax attention probabilities `[batch, heads, q_len, k_len]` of the rotated queries
    /// `q: [batch, heads, q_len, head_dim]` over the cached keys `k: [batch, kv_heads, k_len,
    /// head_dim]`, the pass's `columns` of each row: causal (the query at column `start + i`
    /// sees keys up to `start + i`), and in a padded batch blind to the row's padding keys
    /// ([`Columns::padding_mask`]).
    #[trace_attention]
    pub fn attention_probs(&self, q: &Tensor, k: &Tensor, columns: Columns<'_>) -> Result<Tensor> {
        let (batch, _, q_len, head_dim) = q.dims4()?;
        let k_len = k.dim(2)?;
        let group = self.num_heads / self.num_kv_heads;
        // Query head h reads KV head h / group, as in Hugging Face's `repeat_kv`.
        let q = q.reshape((batch, self.num_kv_heads, group * q_len, head_dim))?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (head_dim as f64).sqrt()))?.reshape((
            batch,
            self.num_heads,
            q_len,
            k_len,
        ))?;
        let scores = if columns.is_padded() {
            let mut padding = columns.padding.to_vec();
            if bugs::injected_at(Bug::BatchMaskOtherRow, self.index) {
                padding.rotate_left(1);
            }
            let columns = Columns {
                padding: &padding,
                ..columns
            };
            scores.broadcast_add(&columns.padding_mask(q_len, k_len, q.device())?)?
        } else if q_len > 1 {
            scores.broadcast_add(&causal_mask(q_len, columns.start, k_len, q.device())?)?
        } else {
            scores
        };
        candle_nn::ops::softmax_last_dim(&scores)
    }
}

/// `[q_len, k_len]`: 0 where query `position + i` may see key `j`, -inf where `j` is in its future.
fn causal_mask(q_len: usize, position: usize, k_len: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|i| {
            (0..k_len).map(move |j| {
                if j > position + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (q_len, k_len), device)
}

pub struct Mlp {
    gate: QuantLinear,
    up: QuantLinear,
    down: QuantLinear,
}

impl Mlp {
    /// SwiGLU: `down(silu(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        self.down.forward(&(gate * self.up.forward(x)?)?)
    }

    /// [`forward`](Self::forward) with gate and up swapped ([`Bug::GateUpSwapped`]).
    fn forward_swapped(&self, x: &Tensor) -> Result<Tensor> {
        let up = candle_nn::ops::silu(&self.up.forward(x)?)?;
        self.down.forward(&(up * self.gate.forward(x)?)?)
    }
}

pub struct Block {
    /// The block's place in the model, 0 for the first: its layer index in traces.
    index: usize,
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    /// One pre-norm transformer block over `x: [batch, seq, hidden]`, the pass's `columns` of
    /// each row; returns the residual stream after the block.
    ///
    /// Stages, for the layer record (the meanings of `model_trace::Stage`):
    /// - `attn_in`: the attention norm's output, what the attention reads;
    /// - `attn_out`: the attention's output after `o_proj`, before the residual add;
    /// - `resid_mid`: the residual stream after the add, `x + attn_out`;
    /// - `mlp_in`: the MLP norm's output, what the MLP reads;
    /// - `mlp_out`: the MLP's output after `down_proj`, before the residual add.
    ///
    /// The layer's index is the block's place in the model ([`Block::index`]), not its call
    /// order within the forward pass: a pipeline stage that runs blocks 15 to 29 records them as
    /// layers 15 to 29.
    #[trace_layer(index = self.index)]
    pub fn forward(&self, x: &Tensor, columns: Columns<'_>, cache: &mut KvCache) -> Result<Tensor> {
        let attn_in = self.attn_norm.forward_in(x, self.index)?;
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attn.forward(&attn_in, columns, cache)?;
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = (x + &attn_out)?;
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = self.ffn_norm.forward_in(&resid_mid, self.index)?;
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = if bugs::injected_at(Bug::GateUpSwapped, self.index) {
            self.mlp.forward_swapped(&mlp_in)?
        } else {
            self.mlp.forward(&mlp_in)?
        };
        trace_tensor!("mlp_out", &mlp_out);
        &resid_mid + &mlp_out
    }

    /// The block's place in the model, 0 for the first.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn attention(&self) -> &Attention {
        &self.attn
    }
}

/// The final norm and the output head: what turns the last block's output into logits.
pub struct OutputHead {
    norm: RmsNorm,
    /// The output projection; SmolLM2 ties it to the (Q8_0) token embeddings.
    head: QuantLinear,
}

impl OutputHead {
    /// `hidden: [batch, hidden] -> [batch, vocab]`. Recorded as the layer one past the highest
    /// layer index of the pass (30 after SmolLM2's 30 blocks).
    #[trace_logits]
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.project(hidden)
    }

    /// What [`OutputHead::logits`] computes, without being the final head: the logit lens reads
    /// every layer through it.
    fn project(&self, hidden: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.norm.forward(hidden)?)
    }
}

pub struct Model {
    config: Config,
    device: Device,
    /// Token embeddings dequantized to f32 `[vocab, hidden]`: a lookup, not a matmul.
    embeddings: Tensor,
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    output: OutputHead,
    /// When on, each block's output at the last position also goes through the final norm and
    /// the head (the logit lens). Off by default: it costs one head matmul per layer.
    pub logit_lens: bool,
    lens: Vec<Tensor>,
    /// Each row's left padding in the sequences the caches hold (set by the pass at position 0).
    padding: Vec<usize>,
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
        let mut linear = |name: String| -> LoadResult<QuantLinear> {
            let weight = Arc::new(gguf.qtensor(&name, &device)?);
            Ok(QuantLinear::new(name, weight)?)
        };
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let attn_weights = (
                linear(format!("blk.{i}.attn_q.weight"))?,
                linear(format!("blk.{i}.attn_k.weight"))?,
                linear(format!("blk.{i}.attn_v.weight"))?,
                linear(format!("blk.{i}.attn_output.weight"))?,
            );
            let mlp = Mlp {
                gate: linear(format!("blk.{i}.ffn_gate.weight"))?,
                up: linear(format!("blk.{i}.ffn_up.weight"))?,
                down: linear(format!("blk.{i}.ffn_down.weight"))?,
            };
            layers.push((attn_weights, mlp));
        }
        let rotary = Arc::new(Rotary::new(&config, &device)?);
        let mut blocks = Vec::with_capacity(config.num_layers);
        for (i, ((q, k, v, o), mlp)) in layers.into_iter().enumerate() {
            blocks.push(Block {
                index: i,
                attn_norm: norm(gguf, &format!("blk.{i}.attn_norm.weight"), &config, &device)?,
                attn: Attention {
                    index: i,
                    q,
                    k,
                    v,
                    o,
                    num_heads: config.num_heads,
                    num_kv_heads: config.num_kv_heads,
                    head_dim: config.head_dim,
                    rotary: rotary.clone(),
                },
                ffn_norm: norm(gguf, &format!("blk.{i}.ffn_norm.weight"), &config, &device)?,
                mlp,
            });
        }
        let embedding_weight = Arc::new(gguf.qtensor("token_embd.weight", &device)?);
        let embeddings = embedding_weight.dequantize(&device)?;
        let head = if gguf.has_tensor("output.weight") {
            let weight = Arc::new(gguf.qtensor("output.weight", &device)?);
            QuantLinear::new("output.weight", weight)?
        } else {
            QuantLinear::new("token_embd.weight", embedding_weight)?
        };
        let norm = norm(gguf, "output_norm.weight", &config, &device)?;
        let caches = (0..config.num_layers)
            .map(|layer| KvCache::new(layer, config.context_length))
            .collect();
        Ok(Self {
            config,
            device,
            embeddings,
            blocks,
            caches,
            output: OutputHead { norm, head },
            logit_lens: false,
            lens: Vec::new(),
            padding: vec![0],
        })
    }

    /// Runs `tokens`, the sequence's tokens from `position` on, and returns the logits `[vocab]`
    /// for the token after the last one: [`Model::forward_batch`] on a batch of one row.
    ///
    /// `position == 0` starts a new sequence (the KV caches are cleared); otherwise `position`
    /// must equal the number of positions already cached.
    pub fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor> {
        self.forward_batch(&Batch::one(tokens), position)?
            .squeeze(0)
    }

    /// Runs the rows of `batch` from column `position` on, each row a sequence of its own
    /// (left-padded: [`Batch`]), and returns the logits `[rows, vocab]` for the token after each
    /// row's last one. Every forward pass of the model goes through here.
    ///
    /// `position == 0` starts new sequences (the KV caches are cleared, `batch`'s padding is
    /// the sequences'); otherwise `position` must equal the number of columns already cached,
    /// and `batch` must have the same rows and padding.
    #[trace_model(position = position, tokens = batch.ids(), name = "forward")]
    pub fn forward_batch(&mut self, batch: &Batch, position: usize) -> Result<Tensor> {
        let mut x = embed(&self.embeddings, batch.ids(), batch.rows())?;
        continue_sequence(&mut self.caches, position)?;
        self.continue_padding(batch, position)?;
        let columns = batch.columns_at(position);
        self.lens.clear();
        for i in 0..self.blocks.len() {
            x = self.blocks[i].forward(&x, columns, &mut self.caches[i])?;
            if self.logit_lens {
                // Block i's output read as a prediction. Not `self.logits`: that is the final
                // head's own tracepoint, recorded as the layer after the last block.
                let lens = self.project(&last_position(&x)?)?;
                trace_logits_value!(&lens, layer = i);
                self.lens.push(lens);
            }
        }
        self.logits(&last_position(&x)?)
    }

    /// Takes `batch`'s padding as the sequences' at `position` 0; checks it is theirs after.
    fn continue_padding(&mut self, batch: &Batch, position: usize) -> Result<()> {
        if position == 0 {
            if let Some(row) = (0..batch.rows()).find(|&b| batch.padding()[b] >= batch.columns()) {
                candle_core::bail!(
                    "row {row} of the batch is all padding ({} of {} columns)",
                    batch.padding()[row],
                    batch.columns()
                );
            }
            self.padding = batch.padding().to_vec();
        } else if batch.padding() != self.padding {
            candle_core::bail!(
                "a pass of rows padded {:?} continues sequences padded {:?}",
                batch.padding(),
                self.padding
            );
        }
        Ok(())
    }

    /// The final norm and the output head: `hidden: [batch, hidden] -> [batch, vocab]`
    /// ([`OutputHead::logits`], the traced site).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.output.logits(hidden)
    }

    /// What [`Model::logits`] computes, without being the final head: the logit lens reads every
    /// layer through it.
    fn project(&self, hidden: &Tensor) -> Result<Tensor> {
        self.output.project(hidden)
    }

    /// The logit lens of the last forward pass: one `[vocab]` tensor per layer (`[rows, vocab]`
    /// after a batch of several rows), empty unless `logit_lens` was on.
    pub fn lens_logits(&self) -> Result<Vec<Tensor>> {
        self.lens.iter().map(|l| l.squeeze(0)).collect()
    }

    pub fn clear_cache(&mut self) {
        self.caches.iter_mut().for_each(KvCache::clear);
    }

    /// Positions in the KV caches (all layers hold the same number).
    pub fn cached_len(&self) -> usize {
        self.caches.first().map_or(0, KvCache::len)
    }

    pub fn caches(&self) -> &[KvCache] {
        &self.caches
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

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Fault injection for the tests: writes a NaN into the first weight of `layer`'s attention
    /// norm, so the NaN appears in that layer's `post_norm` and flows on from there.
    #[doc(hidden)]
    pub fn poison_layer(&mut self, layer: usize) -> Result<()> {
        let Some(block) = self.blocks.get_mut(layer) else {
            candle_core::bail!("no layer {layer} in {} layers", self.config.num_layers);
        };
        let weight = &block.attn_norm.weight;
        let mut values = weight.to_vec1::<f32>()?;
        if let Some(first) = values.first_mut() {
            *first = f32::NAN;
        }
        block.attn_norm.weight = Tensor::from_vec(values, weight.dims(), weight.device())?;
        Ok(())
    }
}

/// The model taken apart, for [`crate::pipeline`] to deal its blocks out to stages.
pub(crate) struct ModelParts {
    pub(crate) embeddings: Tensor,
    pub(crate) blocks: Vec<Block>,
    pub(crate) caches: Vec<KvCache>,
    pub(crate) output: OutputHead,
}

impl Model {
    pub(crate) fn into_parts(self) -> ModelParts {
        ModelParts {
            embeddings: self.embeddings,
            blocks: self.blocks,
            caches: self.caches,
            output: self.output,
        }
    }
}

/// Readies `caches` for a forward pass from `position` on: `position == 0` starts a new sequence
/// (the caches are cleared); otherwise `position` must equal the number of positions cached.
pub(crate) fn continue_sequence(caches: &mut [KvCache], position: usize) -> Result<()> {
    if position == 0 {
        caches.iter_mut().for_each(KvCache::clear);
    }
    let cached = caches.first().map_or(0, KvCache::len);
    if cached != position {
        candle_core::bail!("forward at position {position}, but {cached} positions are cached");
    }
    Ok(())
}

/// The rows of `embeddings: [vocab, hidden]` for `tokens`, `rows` rows of as many tokens one
/// after another, as `[rows, tokens / rows, hidden]`.
pub(crate) fn embed(embeddings: &Tensor, tokens: &[u32], rows: usize) -> Result<Tensor> {
    if tokens.is_empty() {
        candle_core::bail!("forward needs at least one token");
    }
    let ids = Tensor::new(tokens, embeddings.device())?;
    let hidden = embeddings.dim(1)?;
    embeddings
        .index_select(&ids, 0)?
        .reshape((rows, tokens.len() / rows, hidden))
}

/// `[batch, seq, hidden] -> [batch, hidden]` at the last position.
pub(crate) fn last_position(x: &Tensor) -> Result<Tensor> {
    let seq_len = x.dim(1)?;
    x.i((.., seq_len - 1, ..))?.contiguous()
}

fn norm(gguf: &mut Gguf, name: &str, config: &Config, device: &Device) -> LoadResult<RmsNorm> {
    let weight = gguf.qtensor(name, device)?.dequantize(device)?;
    if weight.dims() != [config.hidden_size] {
        return Err(Error::Gguf(format!(
            "{name} has shape {:?}, expected [{}]",
            weight.dims(),
            config.hidden_size
        )));
    }
    Ok(RmsNorm {
        weight,
        eps: config.rms_norm_eps,
        misread_eps: config.num_kv_heads as f32,
    })
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
