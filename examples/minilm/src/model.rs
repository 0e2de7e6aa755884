//! BERT as all-MiniLM-L6-v2 uses it: post-LayerNorm encoder layers, exact (erf) GELU, absolute
//! positions, then mean pooling and L2 normalisation into a sentence embedding.
//!
//! Every quantity a tracer reports is reachable on its own, and annotated for model-trace (the
//! annotations compile to nothing unless the `trace` feature is on): `Model::forward` is the
//! whole pass with its token ids (`#[trace_model(tokens = ids)]`), `Layer::forward` one encoder
//! layer (`#[trace_layer]`, numbered by the layer's own index), `attn_out` / `resid_mid` /
//! `mlp_out` are named bindings inside it (`trace_tensor!`, with the meanings of
//! `model_trace::Stage`), and `SelfAttention::attention_probs` returns exactly the softmaxed
//! attention (`#[trace_attention]`, recorded under the enclosing layer, every batch row).

use std::cell::RefCell;
use std::path::Path;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use model_trace::{trace_attention, trace_layer, trace_model, trace_tensor};
use serde::Deserialize;

use crate::bugs::{self, Bug};
use crate::weights::ModelFiles;

/// The part of the Hugging Face `config.json` this implementation reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub hidden_act: String,
}

impl Config {
    pub fn from_file(path: &Path) -> crate::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| crate::Error::Config(format!("cannot read {}: {e}", path.display())))?;
        let config: Config = serde_json::from_str(&text)
            .map_err(|e| crate::Error::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects what the forward pass would otherwise get silently wrong.
    pub fn validate(&self) -> crate::Result<()> {
        if self.hidden_act != "gelu" {
            return Err(crate::Error::Config(format!(
                "hidden_act {:?} is not supported (only \"gelu\", the exact erf form)",
                self.hidden_act
            )));
        }
        if self.hidden_size.checked_rem(self.num_attention_heads) != Some(0) {
            return Err(crate::Error::Config(format!(
                "hidden_size {} does not split into {} heads",
                self.hidden_size, self.num_attention_heads
            )));
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// Word + position + token-type embeddings, then LayerNorm.
pub struct Embeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
}

impl Embeddings {
    fn load(config: &Config, vb: VarBuilder) -> Result<Self> {
        let hidden = config.hidden_size;
        Ok(Embeddings {
            word: candle_nn::embedding(config.vocab_size, hidden, vb.pp("word_embeddings"))?,
            position: candle_nn::embedding(
                config.max_position_embeddings,
                hidden,
                vb.pp("position_embeddings"),
            )?,
            token_type: candle_nn::embedding(
                config.type_vocab_size,
                hidden,
                vb.pp("token_type_embeddings"),
            )?,
            norm: candle_nn::layer_norm(hidden, config.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    /// `ids`: `[batch, seq]` u32. Single-sentence input, so every token has token type 0.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (_batch, seq_len) = ids.dims2()?;
        let max_positions = self.position.embeddings().dim(0)?;
        if seq_len > max_positions {
            candle_core::bail!("{seq_len} tokens exceed the model's {max_positions} positions");
        }
        let words = self.word.forward(ids)?;
        let positions = Tensor::arange(0u32, seq_len as u32, ids.device())?;
        let positions = self.position.forward(&positions)?;
        let token_type = self.token_type.embeddings().get(0)?;
        let summed = words
            .broadcast_add(&positions)?
            .broadcast_add(&token_type)?;
        self.norm.forward(&summed)
    }
}

/// Multi-head self-attention projections (the output projection belongs to the layer, next to
/// the residual it feeds).
pub struct SelfAttention {
    /// The layer it belongs to (for the bug switch).
    layer: usize,
    query: Linear,
    key: Linear,
    value: Linear,
    num_heads: usize,
    head_dim: usize,
}

impl SelfAttention {
    fn load(layer: usize, config: &Config, vb: VarBuilder) -> Result<Self> {
        let hidden = config.hidden_size;
        Ok(SelfAttention {
            layer,
            query: candle_nn::linear(hidden, hidden, vb.pp("query"))?,
            key: candle_nn::linear(hidden, hidden, vb.pp("key"))?,
            value: candle_nn::linear(hidden, hidden, vb.pp("value"))?,
            num_heads: config.num_attention_heads,
            head_dim: config.head_dim(),
        })
    }

    /// `[batch, seq, heads * head_dim]` -> `[batch, heads, seq, head_dim]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (batch, seq_len, _) = x.dims3()?;
        x.reshape((batch, seq_len, self.num_heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// softmax(Q Kᵀ / √d + bias) as `[batch, heads, query, key]`: each row sums to 1 over the keys.
    /// `bias` is `Model::attention_bias`, `[batch, 1, 1, key]`.
    #[trace_attention]
    pub fn attention_probs(&self, hidden: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let query = self.split_heads(&self.query.forward(hidden)?)?;
        let key = self.split_heads(&self.key.forward(hidden)?)?;
        let scale = if bugs::injected_at(Bug::AttentionScaleOverD, self.layer) {
            1.0 / self.head_dim as f64
        } else {
            1.0 / (self.head_dim as f64).sqrt()
        };
        let scores = (query.matmul(&key.t()?)? * scale)?.broadcast_add(bias)?;
        candle_nn::ops::softmax_last_dim(&scores)
    }

    /// The heads' weighted values merged back into `[batch, seq, hidden]`.
    pub fn context(&self, hidden: &Tensor, probs: &Tensor) -> Result<Tensor> {
        let value = self.split_heads(&self.value.forward(hidden)?)?;
        let (batch, _, seq_len, _) = probs.dims4()?;
        probs
            .matmul(&value)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((batch, seq_len, self.num_heads * self.head_dim))
    }
}

/// One post-LayerNorm encoder layer.
pub struct Layer {
    index: usize,
    /// The model's last layer.
    last: bool,
    attention: SelfAttention,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

impl Layer {
    fn load(index: usize, config: &Config, vb: VarBuilder) -> Result<Self> {
        let hidden = config.hidden_size;
        let eps = config.layer_norm_eps;
        let inner = config.intermediate_size;
        Ok(Layer {
            index,
            last: index + 1 == config.num_hidden_layers,
            attention: SelfAttention::load(index, config, vb.pp("attention.self"))?,
            attention_out: candle_nn::linear(hidden, hidden, vb.pp("attention.output.dense"))?,
            attention_norm: candle_nn::layer_norm(
                hidden,
                eps,
                vb.pp("attention.output.LayerNorm"),
            )?,
            intermediate: candle_nn::linear(hidden, inner, vb.pp("intermediate.dense"))?,
            output: candle_nn::linear(inner, hidden, vb.pp("output.dense"))?,
            output_norm: candle_nn::layer_norm(hidden, eps, vb.pp("output.LayerNorm"))?,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn attention(&self) -> &SelfAttention {
        &self.attention
    }

    /// `hidden`: `[batch, seq, hidden]`; `mask`: the additive bias from `Model::attention_bias`.
    ///
    /// Post-LN, so in the stage vocabulary of `model_trace::Stage`: `attn_out` is the
    /// attention's output projection, `resid_mid` the norm of `hidden + attn_out` (what the MLP
    /// reads and is added to), `mlp_out` the MLP's output projection; the layer's output is the
    /// norm of `resid_mid + mlp_out`.
    #[trace_layer(index = self.index())]
    pub fn forward(&self, hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let probs = self.attention.attention_probs(hidden, mask)?;
        capture_attention(&probs);
        let context = self.attention.context(hidden, &probs)?;
        let attn_out = self.attention_out.forward(&context)?;
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = self.attention_norm.forward(&(&attn_out + hidden)?)?;
        trace_tensor!("resid_mid", &resid_mid);
        let intermediate = self.intermediate.forward(&resid_mid)?;
        let activated = if bugs::injected_at(Bug::GeluTanh, self.index) {
            intermediate.gelu()?
        } else {
            intermediate.gelu_erf()?
        };
        let mlp_out = self.output.forward(&activated)?;
        trace_tensor!("mlp_out", &mlp_out);
        let output = self.output_norm.forward(&(mlp_out + &resid_mid)?)?;
        if bugs::injected(Bug::ReversedTokens) && self.last {
            return output.flip(&[1]);
        }
        Ok(output)
    }
}

pub struct Model {
    config: Config,
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

impl Model {
    /// Reads `config.json` and the safetensors (memory-mapped, f32).
    pub fn load(files: &ModelFiles, device: &Device) -> crate::Result<Self> {
        let config = Config::from_file(&files.config)?;
        let tensors = candle_core::safetensors::load(&files.weights, device)?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
        Ok(Model::from_var_builder(config, vb)?)
    }

    /// `vb` rooted where `embeddings.*` and `encoder.layer.N.*` live.
    pub fn from_var_builder(config: Config, vb: VarBuilder) -> Result<Self> {
        let embeddings = Embeddings::load(&config, vb.pp("embeddings"))?;
        let layers = (0..config.num_hidden_layers)
            .map(|index| Layer::load(index, &config, vb.pp(format!("encoder.layer.{index}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            config,
            embeddings,
            layers,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn embeddings(&self) -> &Embeddings {
        &self.embeddings
    }

    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// `[batch, seq]` 0/1 mask -> `[batch, 1, 1, seq]` bias added to the attention scores: 0 where
    /// a token may be attended to, `f32::MIN` (as Hugging Face uses) over padding.
    pub fn attention_bias(mask: &Tensor) -> Result<Tensor> {
        let (batch, seq_len) = mask.dims2()?;
        let keep = mask.to_dtype(DType::F32)?;
        (keep.ones_like()? - keep)?
            .affine(f64::from(f32::MIN), 0.0)?
            .reshape((batch, 1, 1, seq_len))
    }

    /// `ids`, `mask`: `[batch, seq]` (u32). Returns the last hidden state `[batch, seq, hidden]`.
    /// One traced forward pass, with its token ids (a batch's rows one after another);
    /// `embed` and `forward_with_attention` run inside it.
    #[trace_model(tokens = ids)]
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        if ids.dims() != mask.dims() {
            candle_core::bail!(
                "ids {:?} and mask {:?} differ in shape",
                ids.dims(),
                mask.dims()
            );
        }
        let bias = Model::attention_bias(mask)?;
        let mut hidden = self.embeddings.forward(ids)?;
        for layer in &self.layers {
            hidden = layer.forward(&hidden, &bias)?;
        }
        Ok(hidden)
    }

    /// `forward`, plus each layer's `[batch, heads, query, key]` attention probabilities in layer
    /// order: the same tensors the layers computed, not a second computation.
    pub fn forward_with_attention(
        &self,
        ids: &Tensor,
        mask: &Tensor,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let capture = AttentionCapture::start();
        let hidden = self.forward(ids, mask)?;
        Ok((hidden, capture.finish()))
    }

    /// Fault injection for the tracer's tests: NaN in every entry of layer `index`'s attention
    /// output bias, so that the first non-finite value of the pass appears in that layer's
    /// `post_attn` and everything after it is poisoned too.
    #[doc(hidden)]
    pub fn poison_layer(&mut self, index: usize) -> Result<()> {
        let count = self.layers.len();
        let Some(layer) = self.layers.get_mut(index) else {
            candle_core::bail!("no layer {index} to poison (the model has {count})");
        };
        let weight = layer.attention_out.weight().clone();
        let nan = match layer.attention_out.bias() {
            Some(bias) => Tensor::full(f32::NAN, bias.shape(), bias.device())?,
            None => candle_core::bail!("layer {index}'s attention output has no bias"),
        };
        layer.attention_out = Linear::new(weight, Some(nan));
        Ok(())
    }

    /// The sentence embeddings `[batch, hidden]`, unit length, as sentence-transformers defines
    /// them for this model.
    pub fn embed(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let hidden = self.forward(ids, mask)?;
        l2_normalize(&mean_pool(&hidden, mask)?)
    }
}

/// Mean over the tokens the mask keeps: `[batch, seq, hidden]` -> `[batch, hidden]`.
pub fn mean_pool(hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let keep = mask.to_dtype(hidden.dtype())?.unsqueeze(D::Minus1)?;
    let summed = hidden.broadcast_mul(&keep)?.sum(1)?;
    let counts = keep.sum(1)?.clamp(1e-9, f64::INFINITY)?;
    summed.broadcast_div(&counts)
}

/// Rows scaled to unit L2 norm (the epsilon matches `torch.nn.functional.normalize`).
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norms = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    x.broadcast_div(&norms.clamp(1e-12, f64::INFINITY)?)
}

// The attention probabilities leave `Layer::forward` through this side channel rather than a
// second return value, so that the layer keeps returning exactly its output tensor (what a layer
// tracer records). Thread-local, like a tracing session, and only filled while a
// `forward_with_attention` call is running on this thread.
thread_local! {
    static CAPTURED_ATTENTION: RefCell<Option<Vec<Tensor>>> = const { RefCell::new(None) };
}

fn capture_attention(probs: &Tensor) {
    CAPTURED_ATTENTION.with(|slot| {
        if let Some(captured) = slot.borrow_mut().as_mut() {
            captured.push(probs.clone());
        }
    });
}

/// Turns capturing on for its lifetime and restores what was there before, also on `?` and panics.
struct AttentionCapture {
    outer: Option<Vec<Tensor>>,
}

impl AttentionCapture {
    fn start() -> Self {
        let outer = CAPTURED_ATTENTION.with(|slot| slot.replace(Some(Vec::new())));
        AttentionCapture { outer }
    }

    fn finish(self) -> Vec<Tensor> {
        CAPTURED_ATTENTION
            .with(|slot| slot.borrow_mut().as_mut().map(std::mem::take))
            .unwrap_or_default()
    }
}

impl Drop for AttentionCapture {
    fn drop(&mut self) {
        let outer = self.outer.take();
        CAPTURED_ATTENTION.with(|slot| slot.replace(outer));
    }
}
