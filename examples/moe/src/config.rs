//! The model's `config.json` (transformers' `save_pretrained`), read into what the port needs:
//! the block's shapes, the attention (Qwen 3's grouped-query attention or DeepSeek's multi-head
//! latent attention) and the mixture of experts with its router, chosen by `model_type`.

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// The model families this port runs, by `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_moe`: Qwen 3's block (per-head query/key norms) with a softmax top-k router.
    Qwen3Moe,
    /// `deepseek_v3`: multi-head latent attention, a sigmoid router with a selection bias and
    /// grouped top-k, and a shared expert; the first layers dense.
    DeepseekV3,
}

impl Family {
    /// The name in `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen3Moe => "qwen3_moe",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }
}

/// How a router turns its logits into the scores that choose the experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// `softmax(logits)` (Qwen3-MoE).
    Softmax,
    /// `sigmoid(logits)`, each expert on its own (DeepSeek-V3).
    Sigmoid,
}

/// A mixture-of-experts layer's router.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    pub scoring: Scoring,
    /// Experts chosen per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Whether the chosen experts' weights are divided by their sum (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// What the weights are multiplied by at the end (`routed_scaling_factor`; 1 for Qwen).
    pub scaling: f64,
    /// Grouped top-k, `(n_group, topk_group)`, where the router has it (DeepSeek-V3).
    pub groups: Option<(usize, usize)>,
    /// Whether the router has a selection bias (DeepSeek-V3's `e_score_correction_bias`).
    pub selection_bias: bool,
}

/// The mixture of experts of the layers that have one.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per layer.
    pub num_experts: usize,
    /// An expert's hidden width (`moe_intermediate_size`).
    pub expert_width: usize,
    /// The shared expert's hidden width, where the layers have one (DeepSeek-V3:
    /// `moe_intermediate_size · n_shared_experts`).
    pub shared_width: Option<usize>,
    pub router: RouterConfig,
}

/// The attention of every layer.
#[derive(Debug, Clone, PartialEq)]
pub enum AttentionConfig {
    /// Grouped-query attention with RMS norms on each head's queries and keys (Qwen 3).
    Grouped {
        num_kv_heads: usize,
        head_dim: usize,
    },
    Latent(LatentConfig),
}

/// Multi-head latent attention (DeepSeek V2/V3): queries through a low-rank bottleneck
/// (`q_lora_rank`, or one projection where it is null), keys and values from a shared latent
/// of `kv_lora_rank` plus one rotary key of `qk_rope_head_dim` for all heads.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentConfig {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Whether the rotary dimensions are laid out in interleaved pairs (`rope_interleave`).
    pub rope_interleave: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// The dense MLP's hidden width (the layers without experts).
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention: AttentionConfig,
    pub moe: MoeConfig,
    /// Per layer, whether its MLP is the mixture of experts (else the dense MLP).
    pub moe_layers: Vec<bool>,
}

impl Config {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Self::from_json(&json)
    }

    /// The config of a parsed `config.json`.
    pub fn from_json(json: &Value) -> Result<Self> {
        let fields = Fields(json);
        let family = match fields.string("model_type")? {
            "qwen3_moe" => Family::Qwen3Moe,
            "deepseek_v3" => Family::DeepseekV3,
            other => {
                return Err(Error::Config(format!(
                    "model_type {other:?}: this port runs qwen3_moe and deepseek_v3"
                )))
            }
        };
        let num_layers = fields.usize("num_hidden_layers")?;
        let num_heads = fields.usize("num_attention_heads")?;
        let (attention, moe, moe_layers) = match family {
            Family::Qwen3Moe => qwen3_moe(&fields, num_layers)?,
            Family::DeepseekV3 => deepseek_v3(&fields, num_layers, num_heads)?,
        };
        check_router(&moe)?;
        Ok(Self {
            family,
            vocab_size: fields.usize("vocab_size")?,
            hidden_size: fields.usize("hidden_size")?,
            num_layers,
            num_heads,
            intermediate_size: fields.usize("intermediate_size")?,
            rms_norm_eps: fields.f64("rms_norm_eps")?,
            rope_theta: rope_theta(&fields)?,
            max_position_embeddings: fields.usize("max_position_embeddings")?,
            tie_word_embeddings: fields
                .optional_bool("tie_word_embeddings")?
                .unwrap_or(false),
            attention,
            moe,
            moe_layers,
        })
    }
}

/// Qwen3-MoE: grouped-query attention; a layer is a mixture of experts unless it is in
/// `mlp_only_layers`, every `decoder_sparse_step`-th layer (transformers'
/// `Qwen3MoeDecoderLayer`).
fn qwen3_moe(
    fields: &Fields<'_>,
    num_layers: usize,
) -> Result<(AttentionConfig, MoeConfig, Vec<bool>)> {
    if fields.optional_bool("use_sliding_window")? == Some(true) {
        return Err(Error::Config(
            "use_sliding_window is true: this port attends over every position".into(),
        ));
    }
    let head_dim = match fields.optional_usize("head_dim")? {
        Some(dim) => dim,
        None => fields.usize("hidden_size")? / fields.usize("num_attention_heads")?,
    };
    let attention = AttentionConfig::Grouped {
        num_kv_heads: fields.usize("num_key_value_heads")?,
        head_dim,
    };
    // transformers 5 writes `num_local_experts` (its attribute map's name for `num_experts`).
    let num_experts = match fields.optional_usize("num_experts")? {
        Some(n) => n,
        None => fields.usize("num_local_experts")?,
    };
    let step = fields
        .optional_usize("decoder_sparse_step")?
        .unwrap_or(1)
        .max(1);
    let dense: Vec<usize> = fields.usize_list("mlp_only_layers")?;
    let moe_layers = (0..num_layers)
        .map(|i| !dense.contains(&i) && num_experts > 0 && (i + 1) % step == 0)
        .collect();
    let moe = MoeConfig {
        num_experts,
        expert_width: fields.usize("moe_intermediate_size")?,
        shared_width: None,
        router: RouterConfig {
            scoring: Scoring::Softmax,
            top_k: fields.usize("num_experts_per_tok")?,
            norm_topk_prob: fields.optional_bool("norm_topk_prob")?.unwrap_or(false),
            scaling: 1.0,
            groups: None,
            selection_bias: false,
        },
    };
    Ok((attention, moe, moe_layers))
}

/// DeepSeek-V3: multi-head latent attention; layers from `first_k_dense_replace` on are a
/// mixture of experts with a shared expert, routed by sigmoid scores (transformers'
/// `DeepseekV3TopkRouter` always takes the sigmoid, whatever `scoring_func` says).
fn deepseek_v3(
    fields: &Fields<'_>,
    num_layers: usize,
    num_heads: usize,
) -> Result<(AttentionConfig, MoeConfig, Vec<bool>)> {
    let kv_heads = fields
        .optional_usize("num_key_value_heads")?
        .unwrap_or(num_heads);
    if kv_heads != num_heads {
        return Err(Error::Config(format!(
            "num_key_value_heads {kv_heads} is not num_attention_heads {num_heads}: latent \
             attention expands keys and values for every head"
        )));
    }
    let attention = AttentionConfig::Latent(LatentConfig {
        q_lora_rank: fields.optional_usize("q_lora_rank")?,
        kv_lora_rank: fields.usize("kv_lora_rank")?,
        qk_nope_head_dim: fields.usize("qk_nope_head_dim")?,
        qk_rope_head_dim: fields.usize("qk_rope_head_dim")?,
        v_head_dim: fields.usize("v_head_dim")?,
        rope_interleave: fields.optional_bool("rope_interleave")?.unwrap_or(true),
    });
    let expert_width = fields.usize("moe_intermediate_size")?;
    let shared = fields.optional_usize("n_shared_experts")?.unwrap_or(0);
    let first_moe = fields.optional_usize("first_k_dense_replace")?.unwrap_or(0);
    let groups = (fields.usize("n_group")?, fields.usize("topk_group")?);
    let moe = MoeConfig {
        num_experts: fields.usize("n_routed_experts")?,
        expert_width,
        shared_width: (shared > 0).then_some(expert_width * shared),
        router: RouterConfig {
            scoring: Scoring::Sigmoid,
            top_k: fields.usize("num_experts_per_tok")?,
            norm_topk_prob: fields.optional_bool("norm_topk_prob")?.unwrap_or(true),
            scaling: fields.f64("routed_scaling_factor")?,
            groups: Some(groups),
            selection_bias: true,
        },
    };
    Ok((
        attention,
        moe,
        (0..num_layers).map(|i| i >= first_moe).collect(),
    ))
}

/// Fails unless the router's numbers make a choice: k of the experts, groups that split them
/// evenly, enough experts in the chosen groups.
fn check_router(moe: &MoeConfig) -> Result<()> {
    let (experts, k) = (moe.num_experts, moe.router.top_k);
    if k == 0 || k > experts {
        return Err(Error::Config(format!(
            "num_experts_per_tok {k} is not between 1 and the {experts} experts"
        )));
    }
    if let Some((groups, top_groups)) = moe.router.groups {
        let fits = groups > 0 && experts % groups == 0 && top_groups >= 1 && top_groups <= groups;
        if !fits || experts / groups < 2 || top_groups * (experts / groups) < k {
            return Err(Error::Config(format!(
                "n_group {groups}, topk_group {top_groups} do not split {experts} experts into \
                 groups of at least 2 holding {k} chosen experts"
            )));
        }
    }
    Ok(())
}

/// RoPE's base: `rope_parameters.rope_theta` (transformers 5) or `rope_theta`; only plain RoPE
/// (`rope_type` "default") is run.
fn rope_theta(fields: &Fields<'_>) -> Result<f64> {
    let Some(parameters) = fields.0.get("rope_parameters").filter(|v| !v.is_null()) else {
        return fields.f64("rope_theta");
    };
    let parameters = Fields(parameters);
    if let Some(kind) = parameters.0.get("rope_type").and_then(Value::as_str) {
        if kind != "default" {
            return Err(Error::Config(format!(
                "rope_type {kind:?}: this port runs plain RoPE (\"default\")"
            )));
        }
    }
    parameters.f64("rope_theta")
}

/// Typed reads of a JSON object's fields, each failing with the field's name.
struct Fields<'a>(&'a Value);

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        self.0
            .get(key)
            .filter(|v| !v.is_null())
            .ok_or_else(|| Error::Config(format!("no {key}")))
    }

    fn wrong(key: &str, what: &str, value: &Value) -> Error {
        Error::Config(format!("{key} is {value}, not {what}"))
    }

    fn string(&self, key: &str) -> Result<&str> {
        let value = self.get(key)?;
        value
            .as_str()
            .ok_or_else(|| Self::wrong(key, "a string", value))
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let value = self.get(key)?;
        value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| Self::wrong(key, "a whole number", value))
    }

    fn optional_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    fn f64(&self, key: &str) -> Result<f64> {
        let value = self.get(key)?;
        value
            .as_f64()
            .ok_or_else(|| Self::wrong(key, "a number", value))
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_bool()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "true or false", value)),
        }
    }

    /// A list of whole numbers; missing or null is empty.
    fn usize_list(&self, key: &str) -> Result<Vec<usize>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| Self::wrong(key, "a list of whole numbers", item))
                })
                .collect(),
            Some(value) => Err(Self::wrong(key, "a list of whole numbers", value)),
        }
    }
}
