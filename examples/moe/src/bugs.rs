//! Routing bugs that real mixture-of-experts ports shipped (issue 44's list: sglang #35160,
//! mlxcel #391, torchtitan #1448, vllm #12002, #13474, #24119, #58076, transformers #41647,
//! mistral.rs #1278, llama.cpp #18980), to inject so that the tests can check what
//! `model-trace diff` says of each. Every one changes the router alone (its logits, the experts
//! it returns or their weights), never the experts' computation. Never set in normal use: the
//! CLI's hidden `--inject-bug NAME[@LAYER][,...]` sets them for the whole process.

#[path = "../../shared/bug_switch.rs"]
mod bug_switch;

use bug_switch::BugSwitch;

/// A routing bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Softmax router: the top-k chosen by the logits, and the weights the softmax of the k
    /// chosen logits alone (Mixtral's order) instead of the softmax over every expert. With
    /// `norm_topk_prob` the two are the same function (the renormalised top-k probabilities);
    /// without it the weights sum to 1 where the reference's do not.
    SoftmaxAfterTopk,
    /// The chosen experts' weights divided by their sum where the config says not to
    /// (`norm_topk_prob` false).
    Renormalize,
    /// The chosen experts' weights not divided by their sum where the config says to
    /// (`norm_topk_prob` true).
    NoRenormalize,
    /// Sigmoid router: the selection bias added to the weights too (the weights gathered from
    /// `sigmoid + bias` instead of `sigmoid`): vllm #12002, transformers #41647.
    BiasInWeights,
    /// Grouped router: the experts of the groups not chosen masked with 0 instead of
    /// transformers' `-inf` (`masked_fill(~score_mask, -inf)` in `DeepseekV3TopkRouter`): a
    /// masked expert then beats a chosen group's expert whose selection score is negative
    /// (vllm #13474, mistral.rs #1278).
    MaskZero,
    /// `routed_scaling_factor` applied twice (vllm #24119).
    ScaleTwice,
    /// A sigmoid router scoring by softmax (llama.cpp #18980: a GGUF without
    /// `expert_gating_func` read as softmax).
    SoftmaxForSigmoid,
    /// The router logits computed in bf16 (the hidden states and the router's weight rounded to
    /// bf16 before the matmul) where transformers computes them in f32 (vllm #58076).
    RouterBf16,
    /// The expert ids returned one too high (`(id + 1) mod E`), the weights unchanged: each
    /// token's output computed by its neighbours' experts.
    ExpertsOffByOne,
}

impl Bug {
    /// The names of [`Bug::ALL`], e.g. `softmax-after-topk` or `mask-zero`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, bug)| bug)
    }

    /// Every bug with its name.
    pub const ALL: [(&'static str, Bug); 9] = [
        ("softmax-after-topk", Bug::SoftmaxAfterTopk),
        ("renormalize", Bug::Renormalize),
        ("no-renormalize", Bug::NoRenormalize),
        ("bias-in-weights", Bug::BiasInWeights),
        ("mask-zero", Bug::MaskZero),
        ("scale-twice", Bug::ScaleTwice),
        ("softmax-for-sigmoid", Bug::SoftmaxForSigmoid),
        ("router-bf16", Bug::RouterBf16),
        ("experts-off-by-one", Bug::ExpertsOffByOne),
    ];
}

static INJECTED: BugSwitch<Bug> = BugSwitch::new();

/// Injects the bugs of `NAME[@LAYER][,NAME[@LAYER]...]` for the rest of the process (`NAME`
/// alone: in every layer).
pub fn inject_list(text: &str) -> Result<(), String> {
    INJECTED.inject_list(text, Bug::from_name)
}

/// Whether `bug` was injected in `layer` (or in every layer).
pub fn injected_at(bug: Bug, layer: usize) -> bool {
    INJECTED.injected_at(bug, layer)
}

/// Whether `bug` was injected, in any layer.
pub fn injected(bug: Bug) -> bool {
    INJECTED.injected(bug)
}
