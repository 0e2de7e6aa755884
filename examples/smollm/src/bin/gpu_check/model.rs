//! A decode step of SmolLM2-135M's shape with random weights, in candle ops on any device:
//! annotated as `examples/smollm/src/model.rs` is, and its unannotated twin.
//!
//! Per block: RMS norm, the query projection, softmax attention of 9 heads over 64 cached keys
//! (head dim 64; keys and values are a random cache, not projected from the token), the output
//! projection, the residual add, RMS norm, the gated MLP (576 → 1536 → 576) and the residual add;
//! after the blocks, the final norm and the 49,152-wide head. Batch 1, one token.
//!
//! Traced, each block is a `#[trace_layer]` with five `trace_tensor!` stages: seven tensors a
//! layer with its input and output, 210 for 30 layers; the step is the `#[trace_model]`. The
//! twin ([`StepModel::step_twin`], [`Block::forward_twin`]) runs the same helpers in the same
//! order and is no tracepoint, so the two differ by the annotations alone.
//!
//! Weights come from a seeded generator on the host, converted to the element type there and
//! then copied to the device: every device gets the same bits, so CPU and GPU runs compute the
//! same model.

use candle_core::{DType, Device, Result, Tensor};
use model_trace::{trace_layer, trace_model, trace_tensor};

/// SmolLM2-135M's dimensions (its 3 KV heads aside: here each query head has its own cache).
pub const HIDDEN: usize = 576;
pub const HEADS: usize = 9;
pub const HEAD_DIM: usize = 64;
/// Positions in each block's cache.
pub const CACHED: usize = 64;
pub const INTERMEDIATE: usize = 1536;
pub const VOCAB: usize = 49_152;
/// Blocks of SmolLM2-135M.
pub const LAYERS: usize = 30;
/// Tensors each traced block records: its input, five stages, its output.
pub const TENSORS_PER_LAYER: usize = 7;

const RMS_EPS: f32 = 1e-5;

/// The step's weights.
pub struct StepModel {
    blocks: Vec<Block>,
    final_norm: Tensor,
    /// `[hidden, vocab]`.
    head: Tensor,
}

/// One block's weights; matrices are stored `[in, out]`, so `x @ w` projects.
pub struct Block {
    index: usize,
    attn_norm: Tensor,
    q: Tensor,
    /// `[heads, head_dim, cached]`: the cached keys, transposed for `q @ kᵀ`.
    keys_t: Tensor,
    /// `[heads, cached, head_dim]`.
    values: Tensor,
    o: Tensor,
    mlp_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// What a weight is, so that each draws its own values.
#[derive(Clone, Copy)]
enum Site {
    AttnNorm,
    Query,
    Keys,
    Values,
    Output,
    MlpNorm,
    Gate,
    Up,
    Down,
    FinalNorm,
    Head,
    Input,
}

impl StepModel {
    /// `layers` blocks of random weights of `dtype`, on `device`; the same bits for any device.
    pub fn random(layers: usize, dtype: DType, device: &Device) -> Result<Self> {
        let weights = Weights { dtype, device };
        let blocks = (0..layers)
            .map(|index| Block::random(index, &weights))
            .collect::<Result<_>>()?;
        Ok(Self {
            blocks,
            final_norm: weights.norm(Site::FinalNorm, layers)?,
            head: weights.matrix(Site::Head, layers, HIDDEN, VOCAB)?,
        })
    }

    /// The hidden state the step starts from: `[1, hidden]`, random like the weights.
    pub fn input(dtype: DType, device: &Device) -> Result<Tensor> {
        Weights { dtype, device }.tensor(Site::Input, 0, &[1, HIDDEN], 1.0, 0.0)
    }

    /// One decode step, `x: [1, hidden]` -> logits `[1, vocab]`; a forward pass when traced.
    #[trace_model(position = position)]
    pub fn step(&self, x: &Tensor, position: usize) -> Result<Tensor> {
        let mut hidden = x.clone();
        for block in &self.blocks {
            hidden = block.forward(&hidden)?;
        }
        self.logits(&hidden)
    }

    /// [`step`](Self::step) without annotations.
    pub fn step_twin(&self, x: &Tensor) -> Result<Tensor> {
        let mut hidden = x.clone();
        for block in &self.blocks {
            hidden = block.forward_twin(&hidden)?;
        }
        self.logits(&hidden)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(hidden, &self.final_norm, RMS_EPS)?.matmul(&self.head)
    }
}

impl Block {
    fn random(index: usize, weights: &Weights<'_>) -> Result<Self> {
        let heads = |site| weights.tensor(site, index, &[HEADS, CACHED, HEAD_DIM], 1.0, 0.0);
        Ok(Self {
            index,
            attn_norm: weights.norm(Site::AttnNorm, index)?,
            q: weights.matrix(Site::Query, index, HIDDEN, HIDDEN)?,
            keys_t: heads(Site::Keys)?.transpose(1, 2)?.contiguous()?,
            values: heads(Site::Values)?,
            o: weights.matrix(Site::Output, index, HIDDEN, HIDDEN)?,
            mlp_norm: weights.norm(Site::MlpNorm, index)?,
            gate: weights.matrix(Site::Gate, index, HIDDEN, INTERMEDIATE)?,
            up: weights.matrix(Site::Up, index, HIDDEN, INTERMEDIATE)?,
            down: weights.matrix(Site::Down, index, INTERMEDIATE, HIDDEN)?,
        })
    }

    /// The pre-norm block, `x: [1, hidden]` -> the residual stream after it, with the stages of
    /// `examples/smollm`'s `Block::forward`.
    #[trace_layer(index = self.index)]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let attn_in = self.attn_norm(x)?;
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attention(&attn_in)?;
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = (x + &attn_out)?;
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = self.mlp_norm(&resid_mid)?;
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = self.mlp(&mlp_in)?;
        trace_tensor!("mlp_out", &mlp_out);
        &resid_mid + &mlp_out
    }

    /// [`forward`](Self::forward) without annotations.
    pub fn forward_twin(&self, x: &Tensor) -> Result<Tensor> {
        let attn_in = self.attn_norm(x)?;
        let attn_out = self.attention(&attn_in)?;
        let resid_mid = (x + &attn_out)?;
        let mlp_in = self.mlp_norm(&resid_mid)?;
        let mlp_out = self.mlp(&mlp_in)?;
        &resid_mid + &mlp_out
    }

    fn attn_norm(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.attn_norm, RMS_EPS)
    }

    fn mlp_norm(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.mlp_norm, RMS_EPS)
    }

    /// `x: [1, hidden]`: each head's query against the cached keys, softmax, the weighted
    /// values, the output projection.
    fn attention(&self, x: &Tensor) -> Result<Tensor> {
        let q = x.matmul(&self.q)?.reshape((HEADS, 1, HEAD_DIM))?;
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let scores = (q.matmul(&self.keys_t)? * scale)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        probs
            .matmul(&self.values)?
            .reshape((1, HIDDEN))?
            .matmul(&self.o)
    }

    /// SwiGLU: `down(silu(gate(x)) * up(x))`.
    fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&x.matmul(&self.gate)?)?;
        (gate * x.matmul(&self.up)?)?.matmul(&self.down)
    }
}

/// Where random weights go and in what element type.
struct Weights<'a> {
    dtype: DType,
    device: &'a Device,
}

impl Weights<'_> {
    /// `[inputs, outputs]`, uniform with the variance that keeps unit-variance inputs at unit
    /// variance.
    fn matrix(&self, site: Site, layer: usize, inputs: usize, outputs: usize) -> Result<Tensor> {
        let bound = (3.0 / inputs as f32).sqrt();
        self.tensor(site, layer, &[inputs, outputs], bound, 0.0)
    }

    /// An RMS norm's gains, around 1.
    fn norm(&self, site: Site, layer: usize) -> Result<Tensor> {
        self.tensor(site, layer, &[HIDDEN], 0.1, 1.0)
    }

    /// Uniform in `center ± bound`, drawn on the host from `(site, layer)`.
    fn tensor(
        &self,
        site: Site,
        layer: usize,
        shape: &[usize],
        bound: f32,
        center: f32,
    ) -> Result<Tensor> {
        let count = shape.iter().product();
        let mut draws = Draws::new(site as u64, layer as u64);
        let values: Vec<f32> = (0..count)
            .map(|_| center + bound * draws.symmetric())
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu)?
            .to_dtype(self.dtype)?
            .to_device(self.device)
    }
}

/// xorshift64, seeded through splitmix64: reproducible everywhere, and fast enough to draw
/// the step's 130 million weights in a second.
pub struct Draws(u64);

impl Draws {
    pub fn new(stream: u64, index: u64) -> Self {
        let mut z = ((stream << 32) | index).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next_bits(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `[-1, 1)`, on a grid of 2⁻²³.
    pub fn symmetric(&mut self) -> f32 {
        (self.next_bits() >> 40) as f32 * (2.0 / 16_777_216.0) - 1.0
    }
}
