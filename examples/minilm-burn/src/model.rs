//! BERT as all-MiniLM-L6-v2 uses it, in burn: post-LayerNorm encoder layers, exact (erf) GELU,
//! absolute positions, then mean pooling and L2 normalisation into a sentence embedding.
//!
//! Written as burn code is: `burn-nn` modules, tensors taken by value (clone a handle to use it
//! twice), shapes checked by burn's own panics. The model-trace annotations compile to nothing
//! unless the `trace` feature is on: `Model::forward` is one traced forward pass with its token
//! ids (`#[trace_model(tokens = &ids)]`: the ids are borrowed for the trace, then moved into the
//! embeddings), `Layer::forward` one encoder layer (`#[trace_layer]`, numbered by its own index;
//! its input is `hidden`, the first tensor it takes), `attn_out` / `resid_mid` / `mlp_out` the
//! stages of `model_trace::Stage` inside it, and `SelfAttention::attention_probs` the softmaxed
//! attention (`#[trace_attention]`). The stages and names are the candle port's (`minilm`), so
//! the two ports' traces and transformers' line up.

use burn_core::module::Param;
use burn_nn::{Embedding, LayerNorm, LayerNormConfig, Linear};
use burn_tensor::activation::{gelu, gelu_approximate, softmax};
use burn_tensor::{Device, Int, Tensor};
use minilm::bugs::{self, Bug};
use minilm::{Config, ModelFiles};
use model_trace::{trace_attention, trace_layer, trace_model, trace_tensor};

use crate::weights::{Weights, WeightsError};

/// A PyTorch `nn.Linear` (`weight` `[out, in]`, `bias` `[out]`) as burn's `Linear`, which keeps
/// its weight `[in, out]`.
fn linear(weights: &mut Weights, prefix: &str) -> Result<Linear, WeightsError> {
    let weight: Tensor<2> = weights.take(&format!("{prefix}.weight"))?;
    let bias: Tensor<1> = weights.take(&format!("{prefix}.bias"))?;
    Ok(Linear {
        weight: Param::from_tensor(weight.transpose()),
        bias: Some(Param::from_tensor(bias)),
    })
}

fn layer_norm(
    weights: &mut Weights,
    prefix: &str,
    config: &Config,
) -> Result<LayerNorm, WeightsError> {
    let mut norm = LayerNormConfig::new(config.hidden_size)
        .with_epsilon(config.layer_norm_eps)
        .init(weights.device());
    norm.gamma = Param::from_tensor(weights.take(&format!("{prefix}.weight"))?);
    norm.beta = Some(Param::from_tensor(weights.take(&format!("{prefix}.bias"))?));
    Ok(norm)
}

fn embedding(weights: &mut Weights, name: &str) -> Result<Embedding, WeightsError> {
    Ok(Embedding {
        weight: Param::from_tensor(weights.take(name)?),
    })
}

/// Word + position + token-type embeddings, then LayerNorm.
pub struct Embeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
}

impl Embeddings {
    fn load(weights: &mut Weights, config: &Config) -> Result<Self, WeightsError> {
        Ok(Embeddings {
            word: embedding(weights, "embeddings.word_embeddings.weight")?,
            position: embedding(weights, "embeddings.position_embeddings.weight")?,
            token_type: embedding(weights, "embeddings.token_type_embeddings.weight")?,
            norm: layer_norm(weights, "embeddings.LayerNorm", config)?,
        })
    }

    /// `ids`: `[batch, seq]`. Single-sentence input, so every token has token type 0.
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let [batch, seq_len] = ids.dims();
        let device = ids.device();
        let positions = Tensor::<1, Int>::arange(0..seq_len as i64, &device).reshape([1, seq_len]);
        let token_types = Tensor::<2, Int>::zeros([batch, seq_len], &device);
        let summed = self.word.forward(ids)
            + self.position.forward(positions)
            + self.token_type.forward(token_types);
        self.norm.forward(summed)
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
    fn load(weights: &mut Weights, layer: usize, config: &Config) -> Result<Self, WeightsError> {
        let prefix = format!("encoder.layer.{layer}.attention.self");
        Ok(SelfAttention {
            layer,
            query: linear(weights, &format!("{prefix}.query"))?,
            key: linear(weights, &format!("{prefix}.key"))?,
            value: linear(weights, &format!("{prefix}.value"))?,
            num_heads: config.num_attention_heads,
            head_dim: config.head_dim(),
        })
    }

    /// `[batch, seq, heads * head_dim]` -> `[batch, heads, seq, head_dim]`.
    fn split_heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [batch, seq_len, _] = x.dims();
        x.reshape([batch, seq_len, self.num_heads, self.head_dim])
            .swap_dims(1, 2)
    }

    /// softmax(Q Kᵀ / √d + bias) as `[batch, heads, query, key]`: each row sums to 1 over the
    /// keys. `bias` is `Model::attention_bias`, `[batch, 1, 1, key]`.
    #[trace_attention]
    pub fn attention_probs(&self, hidden: Tensor<3>, bias: Tensor<4>) -> Tensor<4> {
        let query = self.split_heads(self.query.forward(hidden.clone()));
        let key = self.split_heads(self.key.forward(hidden));
        let scale = if bugs::injected_at(Bug::AttentionScaleOverD, self.layer) {
            1.0 / self.head_dim as f64
        } else {
            1.0 / (self.head_dim as f64).sqrt()
        };
        let scores = query.matmul(key.swap_dims(2, 3)).mul_scalar(scale) + bias;
        softmax(scores, 3)
    }

    /// The heads' weighted values merged back into `[batch, seq, hidden]`.
    pub fn context(&self, hidden: Tensor<3>, probs: Tensor<4>) -> Tensor<3> {
        let value = self.split_heads(self.value.forward(hidden));
        let [batch, _, seq_len, _] = probs.dims();
        probs.matmul(value).swap_dims(1, 2).reshape([
            batch,
            seq_len,
            self.num_heads * self.head_dim,
        ])
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
    fn load(weights: &mut Weights, index: usize, config: &Config) -> Result<Self, WeightsError> {
        let prefix = format!("encoder.layer.{index}");
        Ok(Layer {
            index,
            last: index + 1 == config.num_hidden_layers,
            attention: SelfAttention::load(weights, index, config)?,
            attention_out: linear(weights, &format!("{prefix}.attention.output.dense"))?,
            attention_norm: layer_norm(
                weights,
                &format!("{prefix}.attention.output.LayerNorm"),
                config,
            )?,
            intermediate: linear(weights, &format!("{prefix}.intermediate.dense"))?,
            output: linear(weights, &format!("{prefix}.output.dense"))?,
            output_norm: layer_norm(weights, &format!("{prefix}.output.LayerNorm"), config)?,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// `hidden`: `[batch, seq, hidden]`; `bias`: the additive bias from `Model::attention_bias`.
    ///
    /// Post-LN, so in the stage vocabulary of `model_trace::Stage`: `attn_out` is the
    /// attention's output projection, `resid_mid` the norm of `hidden + attn_out` (what the MLP
    /// reads and is added to), `mlp_out` the MLP's output projection; the layer's output is the
    /// norm of `resid_mid + mlp_out`.
    #[trace_layer(index = self.index)]
    pub fn forward(&self, hidden: Tensor<3>, bias: Tensor<4>) -> Tensor<3> {
        let probs = self.attention.attention_probs(hidden.clone(), bias);
        let context = self.attention.context(hidden.clone(), probs);
        let attn_out = self.attention_out.forward(context);
        trace_tensor!("attn_out", &attn_out);
        let resid_mid = self.attention_norm.forward(attn_out + hidden);
        trace_tensor!("resid_mid", &resid_mid);
        let intermediate = self.intermediate.forward(resid_mid.clone());
        let activated = if bugs::injected_at(Bug::GeluTanh, self.index) {
            gelu_approximate(intermediate)
        } else {
            gelu(intermediate)
        };
        let mlp_out = self.output.forward(activated);
        trace_tensor!("mlp_out", &mlp_out);
        let output = self.output_norm.forward(mlp_out + resid_mid);
        if bugs::injected(Bug::ReversedTokens) && self.last {
            return output.flip([1]);
        }
        output
    }
}

pub struct Model {
    config: Config,
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

impl Model {
    /// Reads `config.json` and the safetensors onto `device` (f32).
    pub fn load(files: &ModelFiles, device: &Device) -> Result<Self, Box<dyn std::error::Error>> {
        let config = Config::from_file(&files.config)?;
        let mut weights = Weights::read(&files.weights, device)?;
        Ok(Model::from_weights(config, &mut weights)?)
    }

    /// `weights` named as in the Hugging Face file (`embeddings.*`, `encoder.layer.N.*`).
    pub fn from_weights(config: Config, weights: &mut Weights) -> Result<Self, WeightsError> {
        let embeddings = Embeddings::load(weights, &config)?;
        let layers = (0..config.num_hidden_layers)
            .map(|index| Layer::load(weights, index, &config))
            .collect::<Result<Vec<_>, _>>()?;
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

    /// `[batch, seq]` 0/1 mask -> `[batch, 1, 1, seq]` bias added to the attention scores: 0
    /// where a token may be attended to, `f32::MIN` (as Hugging Face uses) over padding.
    pub fn attention_bias(mask: Tensor<2, Int>) -> Tensor<4> {
        let [batch, seq_len] = mask.dims();
        let keep = mask.float();
        keep.neg()
            .add_scalar(1.0)
            .mul_scalar(f32::MIN)
            .reshape([batch, 1, 1, seq_len])
    }

    /// `ids`, `mask`: `[batch, seq]`. Returns the last hidden state `[batch, seq, hidden]`. One
    /// traced forward pass, with its token ids (a batch's rows one after another).
    #[trace_model(tokens = &ids)]
    pub fn forward(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<3> {
        assert_eq!(ids.dims(), mask.dims(), "ids and mask differ in shape");
        let bias = Model::attention_bias(mask);
        let mut hidden = self.embeddings.forward(ids);
        for layer in &self.layers {
            hidden = layer.forward(hidden, bias.clone());
        }
        hidden
    }

    /// The sentence embeddings `[batch, hidden]`, unit length, as sentence-transformers defines
    /// them for this model.
    pub fn embed(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<2> {
        let hidden = self.forward(ids, mask.clone());
        l2_normalize(mean_pool(hidden, mask))
    }
}

/// Mean over the tokens the mask keeps: `[batch, seq, hidden]` -> `[batch, hidden]`.
pub fn mean_pool(hidden: Tensor<3>, mask: Tensor<2, Int>) -> Tensor<2> {
    let [batch, _, width] = hidden.dims();
    let keep: Tensor<3> = mask.float().unsqueeze_dim(2);
    let summed = (hidden * keep.clone()).sum_dim(1);
    let counts = keep.sum_dim(1).clamp_min(1e-9);
    (summed / counts).reshape([batch, width])
}

/// Rows scaled to unit L2 norm (the epsilon matches `torch.nn.functional.normalize`).
pub fn l2_normalize(x: Tensor<2>) -> Tensor<2> {
    let norms = x.clone().square().sum_dim(1).sqrt().clamp_min(1e-12);
    x / norms
}

/// `[1, seq]` ids and mask of one tokenized sentence on `device`.
pub fn sentence_tensors(
    encoded: &minilm::tokenizer::Encoded,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let row = |values: &[u32]| {
        let values: Vec<i64> = values.iter().map(|&v| i64::from(v)).collect();
        let len = values.len();
        Tensor::<2, Int>::from_data(burn_tensor::TensorData::new(values, [1, len]), device)
    };
    (row(&encoded.ids), row(&encoded.mask))
}
