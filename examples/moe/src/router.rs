//! The router of a mixture-of-experts layer: which `k` experts each token goes to and with what
//! weights, as transformers' `Qwen3MoeTopKRouter` (softmax, top-k, `norm_topk_prob`) and
//! `DeepseekV3TopkRouter` (sigmoid, selection bias, grouped top-k, `norm_topk_prob`,
//! `routed_scaling_factor`) compute it:
//!
//! ```text
//! logits  = x · Wᵀ                                   (f32, [rows, E])
//! softmax: scores = softmax(logits); experts = top_k(scores); w = scores[experts]
//! sigmoid: scores = sigmoid(logits); choice = scores + bias
//!          group score = sum of the group's two best choices; keep the topk_group best groups,
//!          the others' experts masked with -inf; experts = top_k(choice); w = scores[experts]
//! w /= sum(w)           where norm_topk_prob (sigmoid: + 1e-20)
//! w *= routed_scaling_factor
//! ```
//!
//! The logits are a matmul; the choice is made row by row on the host, where each step (and
//! each bug of [`crate::bugs`], all of which are here) is one line. The router returns
//! `(logits, weights, experts)`, which `#[trace_router]` records as a `router` event per call
//! (with the scoring, the selection bias and the groups the model declares: a bug that scores
//! otherwise still says what the model should do, so that its own margins can show it).

use crate::bugs::{self, Bug};
use crate::config::{RouterConfig, Scoring};
use candle_core::{DType, Result, Tensor};
use model_trace::trace_router;

/// One layer's router.
pub struct Router {
    /// The layer it belongs to (for the bug switches).
    layer: usize,
    /// `[experts, hidden]`.
    weight: Tensor,
    /// The selection bias (`e_score_correction_bias`, `[experts]`), where the router has one.
    bias: Option<Tensor>,
    bias_values: Vec<f32>,
    config: RouterConfig,
}

/// One token's choice: the experts in the order chosen (best first) and their weights.
struct Choice {
    experts: Vec<u32>,
    weights: Vec<f32>,
}

impl Router {
    /// The router of `layer` with its `weight` `[experts, hidden]` and, for a router with a
    /// selection bias, the `bias` `[experts]`.
    pub fn new(
        layer: usize,
        weight: Tensor,
        bias: Option<Tensor>,
        config: RouterConfig,
    ) -> Result<Self> {
        let bias_values = match &bias {
            Some(bias) => bias.to_vec1::<f32>()?,
            None => Vec::new(),
        };
        Ok(Self {
            layer,
            weight,
            bias,
            bias_values,
            config,
        })
    }

    /// Routes `xs: [rows, hidden]`: the logits `[rows, experts]`, the weights `[rows, k]` (f32)
    /// and the experts `[rows, k]` (u32), best first.
    pub fn route(&self, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        match self.config.scoring {
            Scoring::Softmax => self.route_softmax(xs),
            Scoring::Sigmoid => self.route_sigmoid(xs),
        }
    }

    /// The softmax router (Qwen3-MoE).
    #[trace_router(scoring = softmax)]
    fn route_softmax(&self, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        self.route_rows(xs, Self::softmax_choice)
    }

    /// The sigmoid router with its selection bias and groups (DeepSeek-V3).
    #[trace_router(scoring = sigmoid, bias = &self.bias, groups = (self.n_group(), self.topk_group()))]
    fn route_sigmoid(&self, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        self.route_rows(xs, Self::sigmoid_choice)
    }

    /// The logits of `xs`, each row's choice by `choose`, as the router's three tensors.
    fn route_rows(
        &self,
        xs: &Tensor,
        choose: fn(&Self, &[f32]) -> Choice,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let logits = self.logits(xs)?;
        let choices: Vec<Choice> = (logits.to_vec2::<f32>()?.iter())
            .map(|row| choose(self, row))
            .collect();
        let (rows, k) = (choices.len(), self.config.top_k);
        let weights: Vec<f32> = choices.iter().flat_map(|c| c.weights.clone()).collect();
        let experts: Vec<u32> = choices.iter().flat_map(|c| c.experts.clone()).collect();
        let device = logits.device().clone();
        Ok((
            logits,
            Tensor::from_vec(weights, (rows, k), &device)?,
            Tensor::from_vec(experts, (rows, k), &device)?,
        ))
    }

    /// How many groups the experts split into (`n_group`; 1 for a router without groups).
    fn n_group(&self) -> usize {
        self.config.groups.map_or(1, |(groups, _)| groups)
    }

    /// How many groups the experts are chosen from (`topk_group`; 1 without groups).
    fn topk_group(&self) -> usize {
        self.config.groups.map_or(1, |(_, top_groups)| top_groups)
    }

    /// `xs · Wᵀ` in f32, `[rows, experts]` (`router-bf16`: both rounded to bf16 first, the
    /// product in bf16).
    fn logits(&self, xs: &Tensor) -> Result<Tensor> {
        if bugs::injected_at(Bug::RouterBf16, self.layer) {
            let xs = xs.to_dtype(DType::BF16)?;
            let weight = self.weight.to_dtype(DType::BF16)?;
            return xs.matmul(&weight.t()?)?.to_dtype(DType::F32);
        }
        xs.matmul(&self.weight.t()?)
    }

    /// One token's choice by softmax scores.
    fn softmax_choice(&self, logits: &[f32]) -> Choice {
        let k = self.config.top_k;
        let (experts, weights) = if self.injected(Bug::SoftmaxAfterTopk) {
            let experts = top_k(logits, k);
            let chosen: Vec<f32> = experts.iter().map(|&e| logits[e]).collect();
            (experts, softmax(&chosen))
        } else {
            let scores = softmax(logits);
            let experts = top_k(&scores, k);
            let weights = experts.iter().map(|&e| scores[e]).collect();
            (experts, weights)
        };
        self.finish(experts, weights, 0.0)
    }

    /// One token's choice by sigmoid scores plus the selection bias, among the best groups.
    fn sigmoid_choice(&self, logits: &[f32]) -> Choice {
        let scores = if self.injected(Bug::SoftmaxForSigmoid) {
            softmax(logits)
        } else {
            logits.iter().map(|&l| sigmoid(l)).collect()
        };
        let choice: Vec<f32> = match self.bias_values.as_slice() {
            [] => scores.clone(),
            bias => scores.iter().zip(bias).map(|(s, b)| s + b).collect(),
        };
        let masked = match self.config.groups {
            Some((groups, top_groups)) => self.mask_groups(&choice, groups, top_groups),
            None => choice.clone(),
        };
        let experts = top_k(&masked, self.config.top_k);
        let weighted_by = if self.injected(Bug::BiasInWeights) {
            &choice
        } else {
            &scores
        };
        let weights = experts.iter().map(|&e| weighted_by[e]).collect();
        self.finish(experts, weights, 1e-20)
    }

    /// `choice` with the experts of all but the `top_groups` best of `groups` groups (each
    /// scored by the sum of its two best choices) masked: `-inf` (`mask-zero`: 0).
    fn mask_groups(&self, choice: &[f32], groups: usize, top_groups: usize) -> Vec<f32> {
        let size = choice.len() / groups;
        let group_scores: Vec<f32> = choice
            .chunks(size)
            .map(|group| top_k(group, 2).iter().map(|&e| group[e]).sum())
            .collect();
        let kept = top_k(&group_scores, top_groups);
        let masked_value = if self.injected(Bug::MaskZero) {
            0.0
        } else {
            f32::NEG_INFINITY
        };
        choice
            .iter()
            .enumerate()
            .map(|(e, &c)| {
                if kept.contains(&(e / size)) {
                    c
                } else {
                    masked_value
                }
            })
            .collect()
    }

    /// The chosen `experts`' `weights` renormalised (by their sum plus `epsilon`) where the
    /// config says to, scaled by `routed_scaling_factor`, the ids as returned.
    fn finish(&self, experts: Vec<usize>, mut weights: Vec<f32>, epsilon: f32) -> Choice {
        let renormalize = if self.config.norm_topk_prob {
            !self.injected(Bug::NoRenormalize)
        } else {
            self.injected(Bug::Renormalize)
        };
        if renormalize {
            let sum = weights.iter().sum::<f32>() + epsilon;
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        let times = if self.injected(Bug::ScaleTwice) { 2 } else { 1 };
        for _ in 0..times {
            if self.config.scaling != 1.0 {
                let scaling = self.config.scaling as f32;
                weights.iter_mut().for_each(|w| *w *= scaling);
            }
        }
        let num_experts = self.weight.dims()[0];
        let shift = usize::from(self.injected(Bug::ExpertsOffByOne));
        let experts = experts
            .into_iter()
            .map(|e| ((e + shift) % num_experts) as u32)
            .collect();
        Choice { experts, weights }
    }

    fn injected(&self, bug: Bug) -> bool {
        bugs::injected_at(bug, self.layer)
    }
}

/// The indices of the `k` largest values, largest first; of equal values the lower index first
/// (a NaN counts as smaller than every number).
pub fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (values[a], values[b]);
        match (x.is_nan(), y.is_nan()) {
            (false, false) => y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal),
            (nan_x, nan_y) => nan_x.cmp(&nan_y),
        }
    });
    order.truncate(k);
    order
}

/// `exp(x - max) / sum`, in f32 as torch computes it.
fn softmax(values: &[f32]) -> Vec<f32> {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = values.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_largest_first_and_the_lower_index_on_ties() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.9, f32::NAN], 3), vec![3, 1, 2]);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_the_order() {
        let p = softmax(&[1.0, 3.0, 2.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(top_k(&p, 3), vec![1, 2, 0]);
    }
}
