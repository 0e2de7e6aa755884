//! The feed-forward half of a block: the dense SwiGLU MLP, and the mixture of experts (a router,
//! routed experts of the same MLP, and DeepSeek-V3's shared expert), computed as transformers'
//! `Qwen3MoeExperts` / `DeepseekV3Experts` do: expert by expert in id order, each over the
//! tokens routed to it, its output scaled by their weights and added into theirs.

use crate::config::MoeConfig;
use crate::error::Result as LoadResult;
use crate::router::Router;
use crate::weights::Weights;
use candle_core::{Device, Module, Result, Tensor};
use candle_nn::Linear;

/// `down(silu(gate(x)) · up(x))`.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// The MLP of hidden width `width` under `prefix` (`model.layers.0.mlp`,
    /// `model.layers.1.mlp.experts.3`).
    pub fn load(weights: &Weights, prefix: &str, hidden: usize, width: usize) -> LoadResult<Self> {
        let linear = |name: &str, shape: [usize; 2]| -> LoadResult<Linear> {
            let weight = weights.get(&format!("{prefix}.{name}.weight"), &shape)?;
            Ok(Linear::new(weight, None))
        };
        Ok(Self {
            gate: linear("gate_proj", [width, hidden])?,
            up: linear("up_proj", [width, hidden])?,
            down: linear("down_proj", [hidden, width])?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate.forward(x)?.silu()?;
        self.down.forward(&(gate * self.up.forward(x)?)?)
    }
}

/// A mixture-of-experts layer.
pub struct MoeBlock {
    router: Router,
    experts: Vec<Mlp>,
    shared: Option<Mlp>,
}

impl MoeBlock {
    /// Layer `layer`'s experts under `model.layers.{layer}.mlp`: the router `gate.weight` (and
    /// `gate.e_score_correction_bias`), `experts.{e}.*`, `shared_experts.*`.
    pub fn load(
        weights: &Weights,
        layer: usize,
        hidden: usize,
        moe: &MoeConfig,
    ) -> LoadResult<Self> {
        let prefix = format!("model.layers.{layer}.mlp");
        let experts_count = moe.num_experts;
        let weight = weights.get(&format!("{prefix}.gate.weight"), &[experts_count, hidden])?;
        let bias = match moe.router.selection_bias {
            true => Some(weights.get(
                &format!("{prefix}.gate.e_score_correction_bias"),
                &[experts_count],
            )?),
            false => None,
        };
        let router = Router::new(layer, weight, bias, moe.router.clone())?;
        let experts = (0..experts_count)
            .map(|e| {
                let name = format!("{prefix}.experts.{e}");
                Mlp::load(weights, &name, hidden, moe.expert_width)
            })
            .collect::<LoadResult<Vec<_>>>()?;
        let shared = match moe.shared_width {
            Some(width) => Some(Mlp::load(
                weights,
                &format!("{prefix}.shared_experts"),
                hidden,
                width,
            )?),
            None => None,
        };
        Ok(Self {
            router,
            experts,
            shared,
        })
    }

    /// `x: [batch, seq, hidden]` through the routed experts (and the shared one).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (batch, seq, hidden) = x.dims3()?;
        let rows = x.reshape((batch * seq, hidden))?;
        let (_logits, weights, experts) = self.router.route(&rows)?;
        let routed = self
            .routed(&rows, &weights, &experts)?
            .reshape((batch, seq, hidden))?;
        match &self.shared {
            Some(shared) => routed + shared.forward(x)?,
            None => Ok(routed),
        }
    }

    /// The routed experts' output `[rows, hidden]`: each expert, in id order, over the rows
    /// routed to it, scaled by their weights and added into those rows.
    fn routed(&self, rows: &Tensor, weights: &Tensor, experts: &Tensor) -> Result<Tensor> {
        let ids = experts.to_vec2::<u32>()?;
        let weights = weights.to_vec2::<f32>()?;
        let mut out = rows.zeros_like()?;
        for (e, expert) in self.experts.iter().enumerate() {
            let (tokens, scales): (Vec<u32>, Vec<f32>) = ids
                .iter()
                .zip(&weights)
                .enumerate()
                .flat_map(|(token, (ids, weights))| {
                    ids.iter()
                        .zip(weights)
                        .filter(|(&id, _)| id as usize == e)
                        .map(move |(_, &w)| (token as u32, w))
                })
                .unzip();
            if tokens.is_empty() {
                continue;
            }
            let count = tokens.len();
            let tokens = Tensor::new(tokens, &Device::Cpu)?;
            let scales = Tensor::from_vec(scales, (count, 1), &Device::Cpu)?;
            let output = expert
                .forward(&rows.index_select(&tokens, 0)?)?
                .broadcast_mul(&scales)?;
            out = out.index_add(&tokens, &output, 0)?;
        }
        Ok(out)
    }
}
