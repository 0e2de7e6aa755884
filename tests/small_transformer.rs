//! A small decoder-only transformer on `Vec<f32>`, annotated the way a real model would be, and
//! checked against what tracing must record: every tracepoint listed, every record kind with the
//! right layer, statistics equal to those of independently computed values, anomalies at the
//! layer that caused them, panics that do not leak into the next pass, and outputs that do not
//! change by a single bit when a session records.
//!
//! Built without `--features enabled`, the annotations compile to nothing: the same model runs,
//! the output assertions still hold, and the recording assertions become "nothing recorded".

use std::panic::{catch_unwind, AssertUnwindSafe};

use model_trace::{
    trace_attention, trace_kv_cache, trace_layer, trace_logits, trace_model, trace_quant,
    trace_tensor, ModelTracerConfig, Session, TensorError, TensorRef, TraceFilter,
};

const HIDDEN: usize = 16;
const HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 32;
const VOCAB: usize = 50;
const LAYERS: usize = 3;
const MAX_SEQ: usize = 16;
/// Block size of ggml's Q8_0: one scale per 32 consecutive weights.
const Q8_0_BLOCK: usize = 32;
const SEED: u64 = 0x5eed_f00d_cafe;
const PROMPT: [u32; 5] = [3, 17, 42, 8, 25];

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// xorshift64*: deterministic weights without a dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn vector(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform() * scale).collect()
    }

    fn linear(&mut self, rows: usize, cols: usize) -> Linear {
        let scale = 1.0 / (cols as f32).sqrt();
        Linear {
            weight: self.vector(rows * cols, scale),
            cols,
        }
    }

    fn norm_gain(&mut self) -> Vec<f32> {
        (0..HIDDEN).map(|_| 1.0 + 0.1 * self.uniform()).collect()
    }
}

/// `y = W x` with `W` row-major `[rows, cols]`.
struct Linear {
    weight: Vec<f32>,
    cols: usize,
}

impl Linear {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        assert_eq!(x.len(), self.cols);
        self.weight
            .chunks_exact(self.cols)
            .map(|row| row.iter().zip(x).map(|(w, v)| w * v).sum())
            .collect()
    }
}

/// A projection whose weights went through Q8_0 and back, next to the exact ones it stands in
/// for: the quantization error is real, and the reference is known exactly.
struct QuantLinear {
    exact: Linear,
    dequantized: Linear,
}

impl QuantLinear {
    fn new(exact: Linear) -> Self {
        let weight = exact
            .weight
            .chunks(Q8_0_BLOCK)
            .flat_map(|block| {
                let max_abs = block.iter().fold(0.0_f32, |m, w| m.max(w.abs()));
                let scale = if max_abs > 0.0 { max_abs / 127.0 } else { 1.0 };
                block
                    .iter()
                    .map(move |w| (w / scale).round().clamp(-127.0, 127.0) * scale)
            })
            .collect();
        let dequantized = Linear {
            weight,
            cols: exact.cols,
        };
        Self { exact, dequantized }
    }

    fn matmul_f32(&self, x: &[f32]) -> Vec<f32> {
        self.exact.apply(x)
    }

    #[trace_quant(reference = Self::matmul_f32, quant = Q8_0, name = "ffn_up")]
    fn matmul_q8_0(&self, x: &[f32]) -> Vec<f32> {
        self.dequantized.apply(x)
    }
}

/// One layer's keys and values, `[len, HIDDEN]` each.
struct LayerCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    len: usize,
    capacity: usize,
}

impl LayerCache {
    fn new(capacity: usize) -> Self {
        Self {
            keys: Vec::with_capacity(capacity * HIDDEN),
            values: Vec::with_capacity(capacity * HIDDEN),
            len: 0,
            capacity,
        }
    }

    #[trace_kv_cache(
        len = self.len,
        capacity = self.capacity,
        bytes = (self.keys.len() + self.values.len()) * std::mem::size_of::<f32>(),
    )]
    fn append(&mut self, key: &[f32], value: &[f32]) {
        assert!(self.len < self.capacity, "KV cache full");
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
        self.len += 1;
    }
}

struct KvCache {
    layers: Vec<LayerCache>,
}

/// Softmax of each head's scores `[heads, 1, k_len]` in place. The query is the newest position
/// and every cached key precedes it, so the causal mask hides nothing here.
#[trace_attention]
fn causal_softmax<'a>(
    scores: &'a mut [f32],
    shape: &'a [usize],
) -> Result<TensorRef<'a>, TensorError> {
    let k_len = shape[shape.len() - 1];
    for row in scores.chunks_exact_mut(k_len) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0;
        for s in row.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        for s in row.iter_mut() {
            *s /= sum;
        }
    }
    TensorRef::new(scores, shape)
}

fn rms_norm(x: &[f32], gain: &[f32]) -> Vec<f32> {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_square + 1e-6).sqrt();
    x.iter().zip(gain).map(|(v, g)| v * inv * g).collect()
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

struct Block {
    attn_norm: Vec<f32>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: Vec<f32>,
    up: QuantLinear,
    down: Linear,
    /// Makes `forward` panic after its first stage, as a failing kernel would.
    panic_inside: bool,
}

impl Block {
    /// Pre-norm block. `attn_out` and `mlp_out` are the sub-blocks' outputs before they are
    /// added to the residual stream.
    #[trace_layer]
    fn forward(&self, x: &[f32], cache: &mut LayerCache) -> Vec<f32> {
        let normed = rms_norm(x, &self.attn_norm);
        trace_tensor!("attn_in", &normed);
        assert!(!self.panic_inside, "injected failure inside the block");
        let attn = self.attention(&normed, cache);
        trace_tensor!("attn_out", &attn);
        let hidden = add(x, &attn);
        let ffn = self.mlp(&rms_norm(&hidden, &self.ffn_norm));
        trace_tensor!("mlp_out", &ffn);
        add(&hidden, &ffn)
    }

    fn attention(&self, normed: &[f32], cache: &mut LayerCache) -> Vec<f32> {
        let probs = self.attention_probs(normed, cache);
        let len = cache.len;
        let mut mixed = vec![0.0; HIDDEN];
        for head in 0..HEADS {
            let row = &probs[head * len..(head + 1) * len];
            for (t, p) in row.iter().enumerate() {
                let value = &cache.values[t * HIDDEN + head * HEAD_DIM..][..HEAD_DIM];
                for (m, v) in mixed[head * HEAD_DIM..][..HEAD_DIM].iter_mut().zip(value) {
                    *m += p * v;
                }
            }
        }
        self.wo.apply(&mixed)
    }

    /// Appends this position's key and value, then returns the probabilities `[HEADS, len]`.
    fn attention_probs(&self, normed: &[f32], cache: &mut LayerCache) -> Vec<f32> {
        let query = self.wq.apply(normed);
        cache.append(&self.wk.apply(normed), &self.wv.apply(normed));
        let len = cache.len;
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let mut scores = vec![0.0; HEADS * len];
        for head in 0..HEADS {
            let q = &query[head * HEAD_DIM..][..HEAD_DIM];
            for t in 0..len {
                let k = &cache.keys[t * HIDDEN + head * HEAD_DIM..][..HEAD_DIM];
                scores[head * len + t] = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
        }
        let shape = [HEADS, 1, len];
        let probs = causal_softmax(&mut scores, &shape).expect("the shape fits the scores");
        probs.data().to_vec()
    }

    fn mlp(&self, normed: &[f32]) -> Vec<f32> {
        let up: Vec<f32> = self.up.matmul_q8_0(normed).into_iter().map(silu).collect();
        self.down.apply(&up)
    }
}

struct Model {
    embed: Vec<f32>,
    pos_embed: Vec<f32>,
    blocks: Vec<Block>,
    final_norm: Vec<f32>,
    head: Linear,
}

impl Model {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let embed = rng.vector(VOCAB * HIDDEN, 1.0);
        let pos_embed = rng.vector(MAX_SEQ * HIDDEN, 0.1);
        let blocks = (0..LAYERS)
            .map(|_| Block {
                attn_norm: rng.norm_gain(),
                wq: rng.linear(HIDDEN, HIDDEN),
                wk: rng.linear(HIDDEN, HIDDEN),
                wv: rng.linear(HIDDEN, HIDDEN),
                wo: rng.linear(HIDDEN, HIDDEN),
                ffn_norm: rng.norm_gain(),
                up: QuantLinear::new(rng.linear(FFN, HIDDEN)),
                down: rng.linear(HIDDEN, FFN),
                panic_inside: false,
            })
            .collect();
        Self {
            embed,
            pos_embed,
            blocks,
            final_norm: rng.norm_gain(),
            head: rng.linear(VOCAB, HIDDEN),
        }
    }

    fn new_cache(&self) -> KvCache {
        KvCache {
            layers: (0..LAYERS).map(|_| LayerCache::new(MAX_SEQ)).collect(),
        }
    }

    fn embed(&self, token: u32, position: usize) -> Vec<f32> {
        let token = &self.embed[token as usize * HIDDEN..][..HIDDEN];
        add(token, &self.pos_embed[position * HIDDEN..][..HIDDEN])
    }

    /// One decode step: the logits for the token after `token`.
    #[trace_model(position = position)]
    fn forward(&self, token: u32, position: usize, cache: &mut KvCache) -> Vec<f32> {
        let mut hidden = self.embed(token, position);
        for (block, layer_cache) in self.blocks.iter().zip(&mut cache.layers) {
            hidden = block.forward(&hidden, layer_cache);
        }
        self.lm_head(&rms_norm(&hidden, &self.final_norm))
    }

    #[trace_logits]
    fn lm_head(&self, hidden: &[f32]) -> Vec<f32> {
        self.head.apply(hidden)
    }
}

/// [`Model::forward`] as a user who forgot `#[trace_model]` writes it.
fn forward_without_trace_model(
    model: &Model,
    token: u32,
    position: usize,
    cache: &mut KvCache,
) -> Vec<f32> {
    let mut hidden = model.embed(token, position);
    for (block, layer_cache) in model.blocks.iter().zip(&mut cache.layers) {
        hidden = block.forward(&hidden, layer_cache);
    }
    model.lm_head(&rms_norm(&hidden, &model.final_norm))
}

/// Every position of `tokens` through a fresh cache: the logits of each step.
fn decode(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    tokens
        .iter()
        .enumerate()
        .map(|(position, &token)| model.forward(token, position, &mut cache))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The same computation, written out without the annotated `forward` functions, keeping every
// value that tracing summarizes. It must run outside any session: the helpers it shares with
// the model (cache append, softmax, quantized matmul) are tracepoints themselves.
// ---------------------------------------------------------------------------------------------

// The attention and quantization values are only read by the recording assertions.
#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
struct LayerValues {
    input: Vec<f32>,
    attn_in: Vec<f32>,
    attn_out: Vec<f32>,
    mlp_out: Vec<f32>,
    output: Vec<f32>,
    /// `[HEADS, len]`.
    probs: Vec<f32>,
    /// What the Q8_0 projection and its exact reference returned.
    up_quantized: Vec<f32>,
    up_exact: Vec<f32>,
}

#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
struct PassValues {
    layers: Vec<LayerValues>,
    logits: Vec<f32>,
}

fn reference_decode(model: &Model, tokens: &[u32]) -> Vec<PassValues> {
    assert!(!Session::is_active(), "the reference must not be recorded");
    let mut cache = model.new_cache();
    let mut passes = Vec::new();
    for (position, &token) in tokens.iter().enumerate() {
        let mut hidden = model.embed(token, position);
        let mut layers = Vec::new();
        for (block, layer_cache) in model.blocks.iter().zip(&mut cache.layers) {
            let attn_in = rms_norm(&hidden, &block.attn_norm);
            let probs = block.attention_probs(&attn_in, layer_cache);
            // Recomputes the attention from the cache just filled, so must not append again.
            let attn_out = {
                let len = layer_cache.len;
                let mut mixed = vec![0.0; HIDDEN];
                for head in 0..HEADS {
                    for t in 0..len {
                        let p = probs[head * len + t];
                        for d in 0..HEAD_DIM {
                            mixed[head * HEAD_DIM + d] +=
                                p * layer_cache.values[t * HIDDEN + head * HEAD_DIM + d];
                        }
                    }
                }
                block.wo.apply(&mixed)
            };
            let mid = add(&hidden, &attn_out);
            let ffn_in = rms_norm(&mid, &block.ffn_norm);
            let up_quantized = block.up.dequantized.apply(&ffn_in);
            let up_exact = block.up.matmul_f32(&ffn_in);
            let activated: Vec<f32> = up_quantized.iter().copied().map(silu).collect();
            let mlp_out = block.down.apply(&activated);
            let output = add(&mid, &mlp_out);
            layers.push(LayerValues {
                input: hidden,
                attn_in,
                attn_out,
                mlp_out,
                output: output.clone(),
                probs,
                up_quantized,
                up_exact,
            });
            hidden = output;
        }
        let logits = model.head.apply(&rms_norm(&hidden, &model.final_norm));
        passes.push(PassValues { layers, logits });
    }
    passes
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A session that ignores `MODEL_TRACE`, so the test does not depend on the environment.
fn session(config: ModelTracerConfig) -> Session {
    Session::with_trace_filter(config, TraceFilter::all())
}

fn bits(steps: &[Vec<f32>]) -> Vec<Vec<u32>> {
    steps
        .iter()
        .map(|logits| logits.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The index of the largest value that is not NaN.
#[cfg(feature = "enabled")]
fn argmax_ignoring_nan(values: &[f32]) -> usize {
    let mut best: Option<usize> = None;
    for (i, v) in values.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| *v > values[b]) {
            best = Some(i);
        }
    }
    best.expect("a value that is not NaN")
}

#[cfg(feature = "enabled")]
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

/// Nothing of any kind was recorded.
#[cfg(not(feature = "enabled"))]
fn assert_records_nothing(tracer: &model_trace::ModelTracer) {
    assert!(tracer.activation_traces().is_empty());
    assert!(tracer.attention_traces().is_empty());
    assert!(tracer.logit_traces().is_empty());
    assert!(tracer.kv_trace().steps.is_empty());
    assert!(tracer.quant_traces().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn tracepoints_list_every_annotated_site() {
    let listed: Vec<_> = model_trace::tracepoints()
        .into_iter()
        .map(|tp| (tp.kind.as_str(), tp.name, tp.function))
        .collect();
    if cfg!(feature = "enabled") {
        // Sorted by kind, then module (one here), then name.
        let expected = [
            ("model", "forward", "forward"),
            ("layer", "forward", "forward"),
            ("attention", "causal_softmax", "causal_softmax"),
            ("logits", "lm_head", "lm_head"),
            ("kv_cache", "append", "append"),
            ("quant", "ffn_up", "matmul_q8_0"),
            ("tensor", "attn_in", "forward"),
            ("tensor", "attn_out", "forward"),
            ("tensor", "mlp_out", "forward"),
        ];
        assert_eq!(listed, expected);
        let source: Vec<&str> = include_str!("small_transformer.rs").lines().collect();
        for tp in model_trace::tracepoints() {
            assert_eq!(tp.module_path, "small_transformer", "{tp}");
            assert!(tp.file.ends_with("small_transformer.rs"), "{tp}");
            // An attribute's line is its function's signature, with the attribute right above;
            // an inline macro's line is the macro call.
            let at = tp.line as usize - 1;
            if tp.kind.as_str() == "tensor" {
                let call = format!("trace_tensor!(\"{}\"", tp.name);
                assert!(
                    source[at].contains(&call),
                    "{tp} points at `{}`",
                    source[at]
                );
            } else {
                let signature = format!("fn {}", tp.function);
                assert!(
                    source[at].contains(&signature),
                    "{tp} points at `{}`",
                    source[at]
                );
                let attribute = source[at.saturating_sub(6)..at]
                    .iter()
                    .rev()
                    .find(|line| line.trim_start().starts_with("#[trace_"));
                let expected = format!("#[trace_{}", tp.kind);
                assert!(
                    attribute.is_some_and(|line| line.trim_start().starts_with(&expected)),
                    "{tp}: {attribute:?}"
                );
            }
            let shown = tp.to_string();
            assert!(!shown.contains('\n') && shown.contains(tp.name), "{shown}");
        }
    } else {
        assert!(listed.is_empty(), "{listed:?}");
    }
}

#[test]
fn outputs_are_bit_identical_with_and_without_a_session() {
    let model = Model::new(SEED);
    let plain = decode(&model, &PROMPT);

    let full = session(ModelTracerConfig::full());
    let traced_full = decode(&model, &PROMPT);
    let full = full.finish();

    let light = session(ModelTracerConfig::lightweight());
    let traced_light = decode(&model, &PROMPT);
    let light = light.finish();

    assert_eq!(bits(&traced_full), bits(&plain));
    assert_eq!(bits(&traced_light), bits(&plain));
    // The reference used by the statistics test computes the same values.
    let reference: Vec<Vec<f32>> = reference_decode(&model, &PROMPT)
        .into_iter()
        .map(|pass| pass.logits)
        .collect();
    assert_eq!(bits(&reference), bits(&plain));
    // The model computes something: finite logits that change with the input.
    assert!(plain.iter().flatten().all(|v| v.is_finite()));
    assert_ne!(bits(&plain[..1]), bits(&plain[1..2]));

    // The sessions did record, so the comparison above is not vacuous.
    #[cfg(feature = "enabled")]
    {
        assert_eq!(full.forward_passes(), PROMPT.len());
        assert_eq!(light.activation_traces().len(), PROMPT.len());
    }
    #[cfg(not(feature = "enabled"))]
    {
        assert_records_nothing(&full);
        assert_records_nothing(&light);
    }
}

#[test]
fn quantized_projection_differs_from_its_reference() {
    // Without this, a quant trace with cosine 1 and error 0 would prove nothing.
    let model = Model::new(SEED);
    let x: Vec<f32> = (0..HIDDEN).map(|i| (i as f32 * 0.37).sin()).collect();
    let exact = model.blocks[0].up.matmul_f32(&x);
    let quantized = model.blocks[0].up.matmul_q8_0(&x);
    assert_ne!(exact, quantized);
    let max_error = exact
        .iter()
        .zip(&quantized)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(max_error < 0.05, "{max_error}");
}

#[test]
fn full_session_records_every_kind_with_the_right_layers() {
    let model = Model::new(SEED);
    let reference = reference_decode(&model, &PROMPT);
    let session = session(ModelTracerConfig::full());
    let logits = decode(&model, &PROMPT);
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(logits.len(), PROMPT.len());

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        use model_trace::QuantType;

        // Activations: one pass per step, LAYERS layers each, every stage filled.
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), PROMPT.len());
        for (position, pass) in passes.iter().enumerate() {
            assert_eq!(pass.position, position);
            let indices: Vec<usize> = pass.layers.iter().map(|l| l.layer_idx).collect();
            assert_eq!(indices, (0..LAYERS).collect::<Vec<_>>());
            for layer in &pass.layers {
                let names: Vec<&str> = layer.stages().map(|(name, _)| name).collect();
                assert_eq!(names, ["input", "attn_in", "attn_out", "mlp_out", "output"]);
                for (stage, stats) in layer.stages() {
                    assert_eq!(stats.count, HIDDEN, "layer {} {stage}", layer.layer_idx);
                }
                assert!(layer.residual_ratio > 0.0 && layer.residual_ratio < 1.0);
            }
            assert!(!pass.has_anomaly, "{:?}", pass.anomaly_desc);
        }

        // Attention: HEADS rows per layer per step, in the enclosing layer, top key as computed.
        let rows = tracer.attention_traces();
        assert_eq!(rows.len(), PROMPT.len() * LAYERS * HEADS);
        for (i, row) in rows.iter().enumerate() {
            let (position, layer, head) = (i / (LAYERS * HEADS), i / HEADS % LAYERS, i % HEADS);
            assert_eq!((row.layer_idx, row.head_idx), (layer, head), "row {i}");
            assert_eq!(row.query_pos, position, "row {i}");
            assert_eq!(row.num_keys, position + 1, "row {i}");
            let expected = &reference[position].layers[layer].probs;
            let expected = &expected[head * (position + 1)..][..position + 1];
            assert_eq!(row.top_k_positions[0], argmax(expected), "row {i}");
            assert_eq!(row.top_k_weights[0], expected[argmax(expected)], "row {i}");
        }

        // Logits: one trace per step, recorded as the final layer, predicting the argmax.
        let logit_traces = tracer.logit_traces();
        assert_eq!(logit_traces.len(), PROMPT.len());
        for (position, trace) in logit_traces.iter().enumerate() {
            assert_eq!(trace.position, position);
            assert!(!trace.tracked_tokens.is_empty());
            for token in &trace.tracked_tokens {
                assert_eq!(token.layers, [LAYERS]);
            }
            let predicted = trace.predicted_token().expect("a tracked token");
            assert_eq!(predicted.token_id as usize, argmax(&logits[position]));
            assert_eq!(predicted.final_rank(), Some(0));
        }

        // KV cache: one step per append (each layer, each position), growing; each layer's
        // cache numbers its own steps and the peak is the sum over the caches.
        let steps = &tracer.kv_trace().steps;
        assert_eq!(steps.len(), PROMPT.len() * LAYERS);
        for (i, step) in steps.iter().enumerate() {
            let valid = i / LAYERS + 1;
            assert_eq!((step.step, step.layer), (i / LAYERS, Some(i % LAYERS)));
            assert_eq!(step.valid_positions, valid, "step {i}");
            assert_eq!(step.capacity, MAX_SEQ);
            assert_eq!(step.cache_size_bytes, 2 * valid * HIDDEN * 4, "step {i}");
        }
        let peak = LAYERS * 2 * PROMPT.len() * HIDDEN * 4;
        assert_eq!(tracer.kv_trace().peak_memory_bytes, peak);

        // Quantization: one error per layer per step, in the enclosing layer, close to exact.
        let quant = tracer.quant_traces();
        assert_eq!(quant.len(), PROMPT.len());
        for (position, set) in quant.iter().enumerate() {
            assert_eq!(set.position, Some(position));
            let layers: Vec<usize> = set.traces.iter().map(|t| t.layer_idx).collect();
            assert_eq!(layers, (0..LAYERS).collect::<Vec<_>>());
            for trace in &set.traces {
                assert_eq!(trace.site, "ffn_up");
                assert_eq!(trace.quant_type, QuantType::Q8_0);
                assert_eq!(trace.num_elements, FFN);
                assert!(trace.cosine_similarity > 0.999, "{trace:?}");
                let values = &reference[position].layers[trace.layer_idx];
                let max_error = values
                    .up_quantized
                    .iter()
                    .zip(&values.up_exact)
                    .map(|(q, r)| (q - r).abs())
                    .fold(0.0, f32::max);
                assert!(max_error > 0.0);
                assert!((trace.max_abs_error - max_error).abs() <= 1e-6 * max_error.max(1.0));
            }
        }

        let summary = tracer.summary();
        assert_eq!(summary.total_forwards, PROMPT.len());
        assert_eq!(summary.layers_per_pass, LAYERS);
        assert_eq!(summary.anomalies_detected, 0);
    }
    #[cfg(not(feature = "enabled"))]
    drop(reference);
}

#[test]
fn layer_statistics_equal_those_of_independently_computed_values() {
    let model = Model::new(SEED);
    let reference = reference_decode(&model, &PROMPT);
    let session = session(ModelTracerConfig::lightweight());
    let logits = decode(&model, &PROMPT);
    let tracer = session.finish();
    let expected: Vec<Vec<f32>> = reference.iter().map(|pass| pass.logits.clone()).collect();
    assert_eq!(bits(&logits), bits(&expected));

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), reference.len());
        for (pass, values) in passes.iter().zip(&reference) {
            assert_eq!(pass.layers.len(), values.layers.len());
            for (layer, expected) in pass.layers.iter().zip(&values.layers) {
                let at = format!("position {} layer {}", pass.position, layer.layer_idx);
                let from = model_trace::TensorStats::from_slice;
                assert_eq!(layer.input_stats, from(&expected.input), "{at} input");
                assert_eq!(
                    layer.stage("attn_in").copied().unwrap_or_default(),
                    from(&expected.attn_in),
                    "{at} norm"
                );
                assert_eq!(
                    layer.stage("attn_out").copied().unwrap_or_default(),
                    from(&expected.attn_out),
                    "{at} attn"
                );
                assert_eq!(
                    layer.stage("mlp_out").copied().unwrap_or_default(),
                    from(&expected.mlp_out),
                    "{at} ffn"
                );
                assert_eq!(layer.output_stats, from(&expected.output), "{at} output");
            }
        }
        // Lightweight records activations and the KV cache, nothing else.
        assert_eq!(tracer.kv_trace().steps.len(), PROMPT.len() * LAYERS);
        assert!(tracer.attention_traces().is_empty());
        assert!(tracer.logit_traces().is_empty());
        assert!(tracer.quant_traces().is_empty());
    }
}

#[test]
fn nan_in_block_1_weights_is_an_anomaly_at_layer_1() {
    let mut model = Model::new(SEED);
    model.blocks[1].down.weight[0] = f32::NAN;
    let session = session(ModelTracerConfig::full());
    let logits = decode(&model, &PROMPT[..2]);
    let tracer = session.finish();
    // The model really is broken from layer 1 on.
    assert!(logits.iter().flatten().all(|v| v.is_nan()));

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        use model_trace::ActivationAnomalyKind;

        assert_eq!(tracer.activation_traces().len(), 2);
        for pass in tracer.activation_traces() {
            assert!(pass.has_anomaly);
            assert_eq!(pass.anomaly_layer, Some(1));
            assert_eq!(pass.anomaly_kind, Some(ActivationAnomalyKind::Nan));
            let desc = pass.anomaly_desc.as_deref().unwrap_or_default();
            assert!(desc.starts_with("layer 1 mlp_out: NaN"), "{desc}");
            let layer0 = &pass.layers[0];
            assert!(layer0.stages().all(|(_, s)| s.nan_count == 0));
            let layer1 = &pass.layers[1];
            assert_eq!(
                layer1
                    .stage("attn_out")
                    .copied()
                    .unwrap_or_default()
                    .nan_count,
                0
            );
            assert_eq!(
                layer1
                    .stage("mlp_out")
                    .copied()
                    .unwrap_or_default()
                    .nan_count,
                1
            );
            assert_eq!(layer1.output_stats.nan_count, 1);
            assert_eq!(pass.layers[2].output_stats.nan_count, HIDDEN);
        }
        assert_eq!(tracer.summary().anomalies_detected, 2);
    }
}

#[test]
fn panic_inside_a_layer_leaves_the_next_pass_clean() {
    let mut model = Model::new(SEED);
    let expected = decode(&model, &PROMPT[..1]);
    model.blocks[1].panic_inside = true;

    let session = session(ModelTracerConfig::full());
    let mut cache = model.new_cache();
    let failed = catch_unwind(AssertUnwindSafe(|| model.forward(PROMPT[0], 0, &mut cache)));
    assert!(failed.is_err());
    // The session survives the panic (and records only when tracing is compiled in).
    assert_eq!(Session::is_active(), cfg!(feature = "enabled"));
    model.blocks[1].panic_inside = false;
    let logits = model.forward(PROMPT[0], 0, &mut model.new_cache());
    let tracer = session.finish();
    assert_eq!(bits(&[logits]), bits(&expected));

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), 2);
        // The failed pass is kept, closed at the panic: layer 0 whole, layer 1 up to its norm.
        let failed = &passes[0];
        let indices: Vec<usize> = failed.layers.iter().map(|l| l.layer_idx).collect();
        assert_eq!(indices, [0, 1]);
        assert_eq!(failed.layers[0].output_stats.count, HIDDEN);
        assert_eq!(
            failed.layers[1]
                .stage("attn_in")
                .copied()
                .unwrap_or_default()
                .count,
            HIDDEN
        );
        assert_eq!(
            failed.layers[1]
                .stage("attn_out")
                .copied()
                .unwrap_or_default()
                .count,
            0
        );
        assert_eq!(failed.layers[1].output_stats.count, 0);
        // The next pass numbers its layers from 0 again and nests none inside the failed one.
        let clean = &passes[1];
        let indices: Vec<usize> = clean.layers.iter().map(|l| l.layer_idx).collect();
        assert_eq!(indices, (0..LAYERS).collect::<Vec<_>>());
        assert!(clean.layers.iter().all(|l| l.output_stats.count == HIDDEN));
        assert!(!clean.has_anomaly, "{:?}", clean.anomaly_desc);
        let attention_layers: Vec<usize> = tracer
            .attention_traces()
            .iter()
            .map(|t| t.layer_idx)
            .collect();
        assert_eq!(attention_layers, [0, 0, 0, 0, 1, 1, 2, 2]);
        // Only the clean pass reached the head, and its logits are the final layer's.
        assert_eq!(tracer.logit_traces().len(), 1);
        assert!(tracer.logit_traces()[0]
            .tracked_tokens
            .iter()
            .all(|t| t.layers == [LAYERS]));
        let quant_layers: Vec<Vec<usize>> = tracer
            .quant_traces()
            .iter()
            .map(|set| set.traces.iter().map(|t| t.layer_idx).collect())
            .collect();
        assert_eq!(quant_layers, [vec![0], vec![0, 1, 2]]);
    }
}

#[test]
fn enabled_says_whether_tracing_is_compiled_in_and_the_summary_says_when_it_is_not() {
    assert_eq!(model_trace::ENABLED, cfg!(feature = "enabled"));
    let model = Model::new(SEED);
    let session = session(ModelTracerConfig::full());
    decode(&model, &PROMPT[..1]);
    let summary = session.finish().summary();
    let text = summary.to_string();
    if model_trace::ENABLED {
        assert!(!summary.tracing_compiled_out);
        assert!(
            text.starts_with("ModelTracer Summary:\n  Forward passes: 1"),
            "{text}"
        );
    } else {
        assert!(summary.tracing_compiled_out);
        assert_eq!(
            text,
            "ModelTracer Summary: tracing is compiled out: build with --features enabled (or \
             your crate's feature forwarding to it)"
        );
    }
}

#[test]
fn a_decode_step_with_nan_logits_is_an_anomaly_of_its_logits() {
    let mut model = Model::new(SEED);
    // The final norm turns every logit into NaN; every block is healthy.
    model.final_norm[0] = f32::NAN;
    let session = session(ModelTracerConfig::full());
    let logits = decode(&model, &PROMPT[..2]);
    let (tracer, errors) = session.finish_with_errors();
    assert!(logits.iter().flatten().all(|v| v.is_nan()));
    assert!(errors.is_empty(), "{errors:?}");

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        use model_trace::ActivationAnomalyKind;

        for pass in tracer.activation_traces() {
            assert!(pass
                .layers
                .iter()
                .all(|l| l.stages().all(|(_, s)| s.nan_count == 0)));
            assert_eq!(pass.anomaly_layer, Some(LAYERS), "the layer of the logits");
            assert_eq!(pass.anomaly_kind, Some(ActivationAnomalyKind::Nan));
            assert_eq!(
                pass.anomaly_desc.as_deref(),
                Some("layer 3 logits: NaN (50 of 50 values)")
            );
            assert_eq!(pass.anomalies[0].stage.as_deref(), Some("logits"));
        }
        let summary = tracer.summary();
        assert_eq!(summary.anomalies_detected, 2);
        assert!(
            summary.to_string().contains(
                "Anomalies: 2 (first at position 0: layer 3 logits: NaN (50 of 50 values))"
            ),
            "{summary}"
        );
        // No logit is finite, so no token can be followed.
        assert!(tracer.logit_traces().is_empty());
    }
}

#[test]
fn a_nan_logit_ranks_nothing_and_the_finite_ones_are_ranked() {
    let mut model = Model::new(SEED);
    // Token 0's logit is NaN, the others are what they were.
    model.head.weight[0] = f32::NAN;
    let session = session(ModelTracerConfig::full());
    let logits = decode(&model, &PROMPT[..1]);
    let tracer = session.finish();
    assert!(logits[0][0].is_nan() && logits[0][1..].iter().all(|v| v.is_finite()));

    #[cfg(not(feature = "enabled"))]
    assert_records_nothing(&tracer);

    #[cfg(feature = "enabled")]
    {
        let trace = &tracer.logit_traces()[0];
        assert!(trace.tracked_tokens.iter().all(|t| t.token_id != 0));
        let predicted = trace.predicted_token().expect("a tracked token");
        assert_eq!(predicted.token_id as usize, argmax_ignoring_nan(&logits[0]));
        assert_eq!(predicted.final_rank(), Some(0));
        let pass = &tracer.activation_traces()[0];
        assert_eq!(
            pass.anomaly_desc.as_deref(),
            Some("layer 3 logits: NaN (1 of 50 values)")
        );
    }
}

#[test]
fn forgetting_trace_model_is_a_warning() {
    let model = Model::new(SEED);
    let session = session(ModelTracerConfig::lightweight());
    let mut cache = model.new_cache();
    for (position, &token) in PROMPT[..2].iter().enumerate() {
        forward_without_trace_model(&model, token, position, &mut cache);
    }
    let warnings = session.warnings();
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");

    #[cfg(not(feature = "enabled"))]
    {
        assert!(warnings.is_empty());
        assert_records_nothing(&tracer);
    }

    #[cfg(feature = "enabled")]
    {
        use model_trace::RecordErrorKind;

        // Two steps lumped into one pass, layers 0..6: what the warning is about.
        let layers: Vec<usize> = tracer.activation_traces()[0]
            .layers
            .iter()
            .map(|l| l.layer_idx)
            .collect();
        assert_eq!(layers, (0..2 * LAYERS).collect::<Vec<_>>());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].kind, RecordErrorKind::ImplicitPass);
        assert_eq!(
            warnings[0].message,
            "layers recorded outside any #[trace_model] function: they are counted as one \
             implicit pass; annotate the forward function with #[trace_model]"
        );
        assert_eq!(tracer.summary().warnings, 1);
    }
}

#[test]
fn filtering_layers_keeps_their_stages_and_excluding_the_model_suspends_its_passes() {
    let model = Model::new(SEED);
    let filtered = |filter: &str| {
        let session = Session::with_filter(ModelTracerConfig::full(), filter).unwrap();
        decode(&model, &PROMPT[..2]);
        session.finish_with_errors().0
    };

    let layers_only = filtered("layer:*");
    let without_mlp = filtered("layer:*,-mlp_out");
    let no_passes = filtered("-model:*");

    #[cfg(not(feature = "enabled"))]
    for tracer in [layers_only, without_mlp, no_passes] {
        assert_records_nothing(&tracer);
    }

    #[cfg(feature = "enabled")]
    {
        let stages = |tracer: &model_trace::ModelTracer| -> Vec<String> {
            tracer.activation_traces()[1].layers[2]
                .stages()
                .map(|(name, _)| name.to_owned())
                .collect()
        };
        assert_eq!(
            stages(&layers_only),
            ["input", "attn_in", "attn_out", "mlp_out", "output"]
        );
        assert!(layers_only.attention_traces().is_empty());
        assert_eq!(
            stages(&without_mlp),
            ["input", "attn_in", "attn_out", "output"]
        );
        assert_eq!(no_passes.forward_passes(), 0);
        assert!(no_passes.kv_trace().steps.is_empty());
        assert!(no_passes.attention_traces().is_empty());
    }
}
