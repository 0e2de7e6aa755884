//! A toy SmolLM2-135M annotated as `examples/smollm/src/model.rs` is, whose values are drawn
//! instead of computed: the real runtime records it, so its trace is a real full trace.
//!
//! Every site draws its own values from its pass, layer and name (xorshift, a few ns a value):
//! the scales are a model's (the residual stream adds up, norms normalise, attention rows put
//! their weight on the sink, the recent keys and a few others, the head's logits spread over
//! ±12), the shapes SmolLM2's, and the quantized matmuls' references differ from them by a
//! Q4_1- or Q8_0-sized error. No matmul is computed.

use std::borrow::Cow;
use std::fmt;

use model_trace::{
    trace_attention, trace_kv_cache, trace_layer, trace_logits, trace_model, trace_quant,
    trace_tensor, TensorError, TraceTensor,
};

/// SmolLM2-135M's shape.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTERMEDIATE: usize = 1536;
const VOCAB: usize = 49_152;
/// Tokens of the prompt, run in pass 0 ("The capital of France is").
pub(crate) const PROMPT_TOKENS: usize = 5;
/// The layer whose `mlp_out` `--diverge-at` changes.
const DIVERGING_LAYER: usize = LAYERS / 2;

/// Which of the two traces a run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// A: the values as drawn.
    Reference,
    /// B: every drawn value one ulp off A's; optionally a real divergence in one pass.
    Perturbed { diverge_at: Option<usize> },
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reference => f.write_str("reference"),
            Self::Perturbed { diverge_at: None } => f.write_str("perturbed"),
            Self::Perturbed {
                diverge_at: Some(pass),
            } => write!(f, "perturbed, diverging at pass {pass}"),
        }
    }
}

/// The pass being computed and the trace it is for: everything a draw depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) pass: usize,
    pub(crate) variant: Variant,
}

/// Where in the model values are drawn, so that each site draws its own.
#[derive(Debug, Clone, Copy)]
enum Site {
    Embedding,
    Query,
    Key,
    Value,
    AttentionOutput,
    Gate,
    Up,
    Down,
    Head,
    Attention,
}

impl Step {
    /// `count` values drawn for `site` of `layer` in this pass, spread over `±scale`
    /// (triangular, std 0.41·scale), perturbed for B.
    fn draw(self, site: Site, layer: usize, count: usize, scale: f32) -> Vec<f32> {
        let mut draws = Draws::new(self.pass, layer, site as u64);
        let mut values: Vec<f32> = (0..count).map(|_| draws.symmetric() * scale).collect();
        self.perturb(&mut values);
        values
    }

    /// B's values flip the last bit of A's: one ulp, never bit-identical, always close.
    fn perturb(self, values: &mut [f32]) {
        if let Variant::Perturbed { .. } = self.variant {
            for value in values {
                *value = f32::from_bits(value.to_bits() ^ 1);
            }
        }
    }

    /// Whether B's `layer` diverges from A's in this pass.
    fn diverges(self, layer: usize) -> bool {
        matches!(self.variant, Variant::Perturbed { diverge_at: Some(pass) } if pass == self.pass)
            && layer == DIVERGING_LAYER
    }
}

/// xorshift64: fast, and enough for values that only need to differ.
struct Draws(u64);

impl Draws {
    fn new(pass: usize, layer: usize, site: u64) -> Self {
        let seed = (pass as u64) << 24 | (layer as u64) << 8 | site;
        Self(splitmix64(seed) | 1)
    }

    fn next_bits(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// In `[0, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next_bits() >> 40) as f32 * (1.0 / 16_777_216.0)
    }

    /// In `(-1, 1)`, triangular: the sum of two 24-bit uniforms of one draw.
    fn symmetric(&mut self) -> f32 {
        let bits = self.next_bits();
        let (high, low) = ((bits >> 40) as f32, ((bits >> 16) & 0xFF_FFFF) as f32);
        (high + low) * (1.0 / 16_777_216.0) - 1.0
    }
}

/// Spreads a structured seed over all 64 bits.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The toy model's tensors: a shape and `f32` values, row-major.
#[derive(Debug, Clone)]
pub(crate) struct Tensor {
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl TraceTensor for Tensor {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(&self.values))
    }
}

impl Tensor {
    /// `[.., width]` with the same leading dimensions as `self`.
    fn shape_with_width(&self, width: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = width;
        }
        shape
    }

    /// Rows of the last dimension.
    fn rows(&self) -> usize {
        self.shape[..self.shape.len() - 1].iter().product()
    }

    fn add(&self, other: &Self) -> Self {
        Self {
            shape: self.shape.clone(),
            values: self
                .values
                .iter()
                .zip(&other.values)
                .map(|(a, b)| a + b)
                .collect(),
        }
    }

    /// RMS norm of each row (unit weights).
    fn rms_norm(&self) -> Self {
        let width = self.shape.last().copied().unwrap_or(1);
        let mut values = Vec::with_capacity(self.values.len());
        for row in self.values.chunks(width) {
            let mean_square = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
            let scale = 1.0 / (mean_square + 1e-5).sqrt();
            values.extend(row.iter().map(|v| v * scale));
        }
        Self {
            shape: self.shape.clone(),
            values,
        }
    }

    /// The last position of `[batch, seq, hidden]`, as `[batch, hidden]`.
    fn last_position(&self) -> Self {
        let width = self.shape[2];
        Self {
            shape: vec![self.shape[0], width],
            values: self.values[self.values.len() - width..].to_vec(),
        }
    }
}

/// The quantization formats of SmolLM2's GGUF: Q4_1 blocks, a Q8_0 head.
#[derive(Debug, Clone, Copy)]
enum Format {
    Q4_1,
    Q8_0,
}

/// A quantized matmul `[.., in] -> [.., out]`: its output drawn, its f32 reference drawn the
/// same and off by this format's quantization error.
struct QuantLinear {
    format: Format,
    site: Site,
    layer: usize,
    out: usize,
    scale: f32,
}

impl QuantLinear {
    fn new(format: Format, site: Site, layer: usize, out: usize, scale: f32) -> Self {
        Self {
            format,
            site,
            layer,
            out,
            scale,
        }
    }

    /// As `examples/smollm`'s: one traced site per format, so each record has its format.
    fn forward(&self, x: &Tensor, step: Step) -> Tensor {
        match self.format {
            Format::Q4_1 => self.forward_q4_1(x, step),
            Format::Q8_0 => self.forward_q8_0(x, step),
        }
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q4_1, name = "q4_1_matmul")]
    fn forward_q4_1(&self, x: &Tensor, step: Step) -> Tensor {
        self.quantized(x, step, 0.05)
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q8_0, name = "q8_0_matmul")]
    fn forward_q8_0(&self, x: &Tensor, step: Step) -> Tensor {
        self.quantized(x, step, 0.005)
    }

    /// The reference: what the matmul would give on the dequantized f32 weights.
    fn forward_f32(&self, x: &Tensor, step: Step) -> Tensor {
        let count = x.rows() * self.out;
        Tensor {
            shape: x.shape_with_width(self.out),
            values: step.draw(self.site, self.layer, count, self.scale),
        }
    }

    /// The reference plus an error of `relative_error` of its scale.
    fn quantized(&self, x: &Tensor, step: Step, relative_error: f32) -> Tensor {
        let mut output = self.forward_f32(x, step);
        let mut error = Draws::new(step.pass, self.layer, self.site as u64 | 0x80);
        let error_scale = self.scale * relative_error;
        for value in &mut output.values {
            *value += error.symmetric() * error_scale;
        }
        output
    }
}

/// One layer's KV cache: only its bookkeeping, doubling its capacity as SmolLM2's does.
struct KvCache {
    len: usize,
    capacity: usize,
}

impl KvCache {
    const INITIAL_CAPACITY: usize = 64;

    /// Bytes of keys and values the capacity holds.
    fn bytes(&self) -> usize {
        2 * self.capacity * KV_HEADS * HEAD_DIM * std::mem::size_of::<f32>()
    }

    /// Caches `new` positions; returns how many keys attention sees now.
    #[trace_kv_cache(len = self.len, capacity = self.capacity, bytes = self.bytes())]
    fn append(&mut self, new: usize) -> usize {
        self.len += new;
        if self.len > self.capacity {
            self.capacity = self.len.max(Self::INITIAL_CAPACITY).max(self.capacity * 2);
        }
        self.len
    }
}

struct Attention {
    layer: usize,
    q: QuantLinear,
    k: QuantLinear,
    v: QuantLinear,
    o: QuantLinear,
}

impl Attention {
    fn new(layer: usize) -> Self {
        let kv_width = KV_HEADS * HEAD_DIM;
        Self {
            layer,
            q: QuantLinear::new(Format::Q4_1, Site::Query, layer, HIDDEN, 2.0),
            k: QuantLinear::new(Format::Q4_1, Site::Key, layer, kv_width, 2.0),
            v: QuantLinear::new(Format::Q4_1, Site::Value, layer, kv_width, 1.0),
            o: QuantLinear::new(
                Format::Q4_1,
                Site::AttentionOutput,
                layer,
                HIDDEN,
                0.1 + 0.01 * layer as f32,
            ),
        }
    }

    /// `x: [1, seq, hidden]` at `position` -> `[1, seq, hidden]`.
    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache, step: Step) -> Tensor {
        let queries = self.q.forward(x, step);
        let _keys = self.k.forward(x, step);
        let _values = self.v.forward(x, step);
        let k_len = cache.append(x.shape[1]);
        let _probs = self.attention_probs(&queries, k_len, position, step);
        self.o.forward(x, step)
    }

    /// Causal probabilities `[1, heads, q_len, k_len]`: each row puts ~35% on the sink (key 0),
    /// ~15% on the last three keys, ~20% on four others and the rest spread over all it sees.
    #[trace_attention]
    fn attention_probs(
        &self,
        queries: &Tensor,
        k_len: usize,
        position: usize,
        step: Step,
    ) -> Tensor {
        let q_len = queries.shape[1];
        let mut draws = Draws::new(step.pass, self.layer, Site::Attention as u64);
        let mut values = vec![0.0f32; HEADS * q_len * k_len];
        for (index, row) in values.chunks_mut(k_len).enumerate() {
            let visible = (position + index % q_len + 1).min(k_len);
            attention_row(&mut row[..visible], &mut draws);
        }
        step.perturb(&mut values);
        Tensor {
            shape: vec![1, HEADS, q_len, k_len],
            values,
        }
    }
}

/// Fills one row of attention weights over the keys it sees, summing to 1.
fn attention_row(row: &mut [f32], draws: &mut Draws) {
    let keys = row.len();
    for weight in row.iter_mut() {
        *weight = draws.unit();
    }
    let spread: f32 = row.iter().sum();
    let spread_scale = 0.3 / spread.max(f32::MIN_POSITIVE);
    for weight in row.iter_mut() {
        *weight *= spread_scale;
    }
    row[0] += 0.3 + 0.1 * draws.unit();
    for back in 1..=3.min(keys) {
        row[keys - back] += 0.03 + 0.04 * draws.unit();
    }
    for _ in 0..4 {
        let key = (draws.next_bits() % keys as u64) as usize;
        row[key] += 0.03 + 0.04 * draws.unit();
    }
    let total: f32 = row.iter().sum();
    for weight in row.iter_mut() {
        *weight /= total;
    }
}

struct Mlp {
    layer: usize,
    gate: QuantLinear,
    up: QuantLinear,
    down: QuantLinear,
}

impl Mlp {
    fn new(layer: usize) -> Self {
        Self {
            layer,
            gate: QuantLinear::new(Format::Q4_1, Site::Gate, layer, INTERMEDIATE, 2.0),
            up: QuantLinear::new(Format::Q4_1, Site::Up, layer, INTERMEDIATE, 2.0),
            down: QuantLinear::new(
                Format::Q4_1,
                Site::Down,
                layer,
                HIDDEN,
                0.2 + 0.02 * layer as f32,
            ),
        }
    }

    fn forward(&self, x: &Tensor, step: Step) -> Tensor {
        let gate = self.gate.forward(x, step);
        let _up = self.up.forward(x, step);
        let mut out = self.down.forward(&gate, step);
        if step.diverges(self.layer) {
            out.values.iter_mut().for_each(|value| *value *= 1.01);
        }
        out
    }
}

struct Block {
    attention: Attention,
    mlp: Mlp,
}

impl Block {
    /// One pre-norm block over `x: [1, seq, hidden]`, its stages recorded as SmolLM2's are.
    #[trace_layer]
    fn forward(&self, x: &Tensor, position: usize, cache: &mut KvCache, step: Step) -> Tensor {
        let attn_in = x.rms_norm();
        trace_tensor!("attn_in", &attn_in);
        let attn_out = self.attention.forward(&attn_in, position, cache, step);
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = x.add(&attn_out);
        trace_tensor!("resid_mid", &resid_mid);
        let mlp_in = resid_mid.rms_norm();
        trace_tensor!("mlp_in", &mlp_in);
        let mlp_out = self.mlp.forward(&mlp_in, step);
        trace_tensor!("mlp_out", &mlp_out);
        resid_mid.add(&mlp_out)
    }
}

/// SmolLM2-135M's structure with drawn values.
pub(crate) struct Model {
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    head: QuantLinear,
}

impl Model {
    pub(crate) fn new() -> Self {
        Self {
            blocks: (0..LAYERS)
                .map(|layer| Block {
                    attention: Attention::new(layer),
                    mlp: Mlp::new(layer),
                })
                .collect(),
            caches: (0..LAYERS)
                .map(|_| KvCache {
                    len: 0,
                    capacity: 0,
                })
                .collect(),
            head: QuantLinear::new(Format::Q8_0, Site::Head, LAYERS, VOCAB, 12.0),
        }
    }

    /// `tokens` tokens from `position` on -> the next token's logits `[1, vocab]`.
    #[trace_model(position = position)]
    pub(crate) fn forward(&mut self, tokens: usize, position: usize, step: Step) -> Tensor {
        let mut x = Tensor {
            shape: vec![1, tokens, HIDDEN],
            values: step.draw(Site::Embedding, 0, tokens * HIDDEN, 0.1),
        };
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            x = block.forward(&x, position, cache, step);
        }
        self.logits(&x.last_position(), step)
    }

    /// The final norm and the head: `[1, hidden] -> [1, vocab]`.
    #[trace_logits]
    fn logits(&self, hidden: &Tensor, step: Step) -> Tensor {
        self.head.forward(&hidden.rms_norm(), step)
    }
}
