//! What a mixture-of-experts router chose: per token the experts and their weights, how close
//! the choice was, and per call how many tokens each expert received.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::summary::TensorSummary;

/// How a router turns its logits into the scores it chooses experts by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterScoring {
    /// `softmax(logits)` over the experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE).
    #[default]
    Softmax,
    /// `sigmoid(logits)`, each expert on its own (DeepSeek-V3, GLM-4.5).
    Sigmoid,
}

impl RouterScoring {
    /// The name written in the `scoring` field.
    pub const fn as_str(self) -> &'static str {
        match self {
            RouterScoring::Softmax => "softmax",
            RouterScoring::Sigmoid => "sigmoid",
        }
    }
}

/// Grouped top-k (DeepSeek-V3's `n_group`, `topk_group`): the experts are split into `groups`
/// groups of consecutive ids, each group scored by the sum of its two best selection scores, and
/// the experts chosen only among the `top_groups` best groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExpertGroups {
    /// How many groups (`n_group`).
    pub groups: usize,
    /// How many of them the experts are chosen from (`topk_group`).
    pub top_groups: usize,
}

/// One token's routing in one router call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutedToken {
    /// The token's row in the call: the router's logits read as `[rows, experts]` (a
    /// `[batch, seq, experts]` tensor flattened batch-major, as transformers does), so in a pass
    /// of one sequence the token at the pass's position plus `row`.
    pub row: usize,
    /// The chosen experts, as the router returned them.
    pub experts: Vec<u32>,
    /// Their weights, in the same order: what multiplies each expert's output.
    #[serde(with = "crate::float::vec")]
    pub weights: Vec<f32>,
    /// The best expert not chosen, by selection score (among the chosen groups when the router
    /// is grouped: those holding a chosen expert, completed by the best others up to
    /// `top_groups`); `None` when every expert there was chosen.
    pub runner_up: Option<u32>,
    /// Selection score of the weakest chosen expert minus the runner-up's: how decisive the
    /// choice was in the scores it was made by (probabilities for softmax, sigmoid plus the
    /// selection bias for sigmoid). Negative when the chosen experts are not the top-k of the
    /// scores (a port whose indices do not follow its own logits). Infinite without a
    /// runner-up. NaN when one of the two scores is NaN (a NaN logit makes every softmax score
    /// NaN).
    #[serde(with = "crate::float::single")]
    pub margin: f32,
    /// For a grouped router, the group score of the weakest chosen group minus the best other
    /// group's; `None` otherwise, and when every group is chosen.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::float::option"
    )]
    pub group_margin: Option<f32>,
    /// The smallest δ such that moving each router logit by at most δ changes the choice (the
    /// weakest chosen expert and the runner-up, or the weakest chosen group and the best other
    /// one, trading places): the margin in the logits' own units, which `diff` compares with
    /// the other side's logit error. 0 when a margin is not positive, NaN when one is NaN,
    /// infinite when no pair can trade places (or only by moving a logit by more than 600).
    /// Computed as `docs/trace-format.md` says (section `router`).
    #[serde(with = "crate::float::single")]
    pub logit_margin: f32,
    /// The router logits of `experts`, in their order, then of `runner_up`.
    #[serde(with = "crate::float::vec")]
    pub logits: Vec<f32>,
}

/// One call of a router: which experts each token chose, and how many tokens each expert got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterEvent {
    /// Sequence number.
    pub seq: u64,
    /// The pass, if one was open.
    pub pass: Option<usize>,
    /// The layer the router belongs to.
    pub layer: usize,
    /// The router tracepoint.
    pub tracepoint: Cow<'static, str>,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// How the logits become selection scores.
    pub scoring: RouterScoring,
    /// Grouped top-k, when the router declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<ExpertGroups>,
    /// Whether a selection bias was added to the scores (DeepSeek-V3's
    /// `e_score_correction_bias`): it chooses experts and never weights them.
    #[serde(default)]
    pub selection_bias: bool,
    /// Experts of the layer: the logits' last dimension.
    pub num_experts: usize,
    /// Experts chosen per token: the indices' last dimension.
    pub top_k: usize,
    /// The router logits, `[rows, experts]`.
    pub logits: TensorSummary,
    /// Every token of the call, by row.
    pub tokens: Vec<RoutedToken>,
    /// Tokens routed to each expert, by expert id (`num_experts` counts).
    pub load: Vec<usize>,
}
