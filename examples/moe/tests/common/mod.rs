//! Small random models of both families written as transformers' `save_pretrained` writes them
//! (`config.json`, `model.safetensors`, F32), so that the port's tests need no download and no
//! Python: the shapes of `python/tests/moe_models.py`'s models, the values from a fixed
//! pseudo-random sequence (uniform, each tensor's spread chosen as below).

#![allow(dead_code)] // each test binary uses some of it

use candle_core::{Device, Tensor};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const HIDDEN: usize = 64;
pub const LAYERS: usize = 4;
pub const VOCAB: usize = 256;
/// Bumped when what [`Fixture::dir`] writes changes, so that a kept model is written again.
const VERSION: u32 = 1;

/// A test model: its family and what differs from the family's defaults.
#[derive(Debug, Clone, Copy)]
pub struct Fixture {
    /// `qwen3_moe` or `deepseek_v3`.
    pub model_type: &'static str,
    pub norm_topk_prob: bool,
    /// Added to every expert's selection bias (DeepSeek-V3): a shift of all of them changes no
    /// choice of the reference, but makes the selection scores negative below -0.5 or so.
    pub bias_shift: f32,
}

pub const QWEN3_MOE: Fixture = Fixture {
    model_type: "qwen3_moe",
    norm_topk_prob: true,
    bias_shift: 0.0,
};

pub const DEEPSEEK_V3: Fixture = Fixture {
    model_type: "deepseek_v3",
    norm_topk_prob: true,
    bias_shift: 0.0,
};

impl Fixture {
    /// The layers with a mixture of experts.
    pub fn moe_layers(&self) -> Vec<usize> {
        match self.model_type {
            "qwen3_moe" => (0..LAYERS).collect(),
            _ => (1..LAYERS).collect(),
        }
    }

    /// Writes the model (once: the same values every time, kept under the temporary
    /// directory for the next run) and returns its directory.
    pub fn dir(&self) -> PathBuf {
        static WRITING: Mutex<()> = Mutex::new(());
        let _writing = WRITING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!(
            "moe-fixture-v{VERSION}-{}-{}-{}",
            self.model_type, self.norm_topk_prob, self.bias_shift
        ));
        if !dir.join("model.safetensors").is_file() {
            std::fs::create_dir_all(&dir).unwrap();
            self.write(&dir);
        }
        dir
    }

    /// Writes the files under names of this process's, then renames them into place (config
    /// first), so that another test process never reads half a file.
    fn write(&self, dir: &Path) {
        let staged = |name: &str| dir.join(format!("{name}.{}", std::process::id()));
        let config = self.config();
        std::fs::write(staged("config.json"), config.to_string()).unwrap();
        std::fs::rename(staged("config.json"), dir.join("config.json")).unwrap();
        let mut values = Values(0x9e37_79b9_7f4a_7c15);
        let tensors: HashMap<String, Tensor> = self
            .shapes(&config)
            .into_iter()
            .map(|(name, shape)| {
                let tensor = values.tensor(&name, &shape, self.bias_shift);
                (name, tensor)
            })
            .collect();
        candle_core::safetensors::save(&tensors, staged("model.safetensors")).unwrap();
        std::fs::rename(staged("model.safetensors"), dir.join("model.safetensors")).unwrap();
    }

    fn config(&self) -> Value {
        let mut config = json!({
            "model_type": self.model_type, "vocab_size": VOCAB, "hidden_size": HIDDEN,
            "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "moe_intermediate_size": 32, "norm_topk_prob": self.norm_topk_prob,
        });
        let family = match self.model_type {
            "qwen3_moe" => json!({
                "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 8,
                "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
            }),
            _ => json!({
                "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
                "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                "first_k_dense_replace": 1, "rope_interleave": true,
            }),
        };
        let object = config.as_object_mut().unwrap();
        object.extend(family.as_object().unwrap().clone());
        config
    }

    /// Every tensor's name and shape, under transformers' names.
    fn shapes(&self, config: &Value) -> Vec<(String, Vec<usize>)> {
        let mut all = vec![
            ("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]),
            ("model.norm.weight".into(), vec![HIDDEN]),
            ("lm_head.weight".into(), vec![VOCAB, HIDDEN]),
        ];
        let qwen = self.model_type == "qwen3_moe";
        let experts = if qwen { 8 } else { 16 };
        for layer in 0..LAYERS {
            let p = format!("model.layers.{layer}");
            all.push((format!("{p}.input_layernorm.weight"), vec![HIDDEN]));
            all.push((format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]));
            let attention: &[(&str, &[usize])] = if qwen {
                &[
                    ("q_proj", &[64, HIDDEN]),
                    ("k_proj", &[32, HIDDEN]),
                    ("v_proj", &[32, HIDDEN]),
                    ("o_proj", &[HIDDEN, 64]),
                    ("q_norm", &[16]),
                    ("k_norm", &[16]),
                ]
            } else {
                &[
                    ("q_a_proj", &[32, HIDDEN]),
                    ("q_a_layernorm", &[32]),
                    ("q_b_proj", &[4 * 24, 32]),
                    ("kv_a_proj_with_mqa", &[32 + 8, HIDDEN]),
                    ("kv_a_layernorm", &[32]),
                    ("kv_b_proj", &[4 * 32, 32]),
                    ("o_proj", &[HIDDEN, 4 * 16]),
                ]
            };
            for (name, shape) in attention {
                all.push((format!("{p}.self_attn.{name}.weight"), shape.to_vec()));
            }
            if !self.moe_layers().contains(&layer) {
                all.extend(mlp(
                    &format!("{p}.mlp"),
                    config["intermediate_size"].as_u64(),
                ));
                continue;
            }
            all.push((format!("{p}.mlp.gate.weight"), vec![experts, HIDDEN]));
            if !qwen {
                all.push((
                    format!("{p}.mlp.gate.e_score_correction_bias"),
                    vec![experts],
                ));
                all.extend(mlp(&format!("{p}.mlp.shared_experts"), Some(32)));
            }
            for e in 0..experts {
                all.extend(mlp(&format!("{p}.mlp.experts.{e}"), Some(32)));
            }
        }
        all
    }
}

fn mlp(prefix: &str, width: Option<u64>) -> Vec<(String, Vec<usize>)> {
    let width = width.unwrap() as usize;
    vec![
        (format!("{prefix}.gate_proj.weight"), vec![width, HIDDEN]),
        (format!("{prefix}.up_proj.weight"), vec![width, HIDDEN]),
        (format!("{prefix}.down_proj.weight"), vec![HIDDEN, width]),
    ]
}

/// A fixed pseudo-random sequence (xorshift64*).
struct Values(u64);

impl Values {
    fn next_unit(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// The tensor `name`: norms near 1, routers spreading their logits by about 1.5 (so that
    /// most choices are decisive), selection biases of ±0.1 (plus `bias_shift`), the other
    /// weights of transformers' scale (±0.05).
    fn tensor(&mut self, name: &str, shape: &[usize], bias_shift: f32) -> Tensor {
        let count = shape.iter().product();
        let (center, spread) = if name.ends_with("norm.weight") {
            (1.0, 0.1)
        } else if name.ends_with("gate.weight") {
            (0.0, 1.5 * 3f32.sqrt() / (HIDDEN as f32).sqrt())
        } else if name.ends_with("e_score_correction_bias") {
            (bias_shift, 0.1)
        } else if name.contains("embed_tokens") {
            (0.0, 1.0)
        } else {
            (0.0, 0.05)
        };
        let values: Vec<f32> = (0..count)
            .map(|_| center + spread * self.next_unit())
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }
}
