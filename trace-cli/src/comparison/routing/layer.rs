//! One layer's routers compared over every pass: the tokens compared, those routed
//! differently and how, those whose weights differ, and the layer's verdict.

use std::collections::BTreeMap;

use serde::Serialize;
use trace_runtime::{RoutedToken, RouterEvent};

use super::token::{
    judge, logit_error, same_experts, weights_past_error, RoutingVerdict, WeightDifference,
};

/// Tokens a layer must have compared before many near-ties (over a tenth) are noted.
const MANY_NEAR_TIES_OF: usize = 8;

/// A layer's routing in one word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LayerVerdict {
    /// Every token chose the same experts, with the same weights within the logit error.
    #[default]
    Same,
    /// Some tokens chose other experts, each a near-tie.
    NearTies,
    /// A token chose other experts by more than the other's logit error explains.
    Routing,
    /// No divergence, but the weights of tokens that chose alike differ past the logit error
    /// (near-ties may be there too).
    Weights,
    /// The two routers have other numbers of experts or of experts per token: not compared.
    ExpertsDiffer,
}

impl LayerVerdict {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::NearTies => "near-ties",
            Self::Routing => "routing",
            Self::Weights => "weights",
            Self::ExpertsDiffer => "experts differ",
        }
    }
}

/// One layer's routers compared over every pass.
#[derive(Debug, Default, Serialize)]
pub(crate) struct LayerRouting {
    pub(crate) layer: usize,
    pub(crate) verdict: LayerVerdict,
    /// Router calls paired.
    pub(crate) calls: usize,
    /// Tokens compared (matched by row).
    pub(crate) tokens: usize,
    /// Tokens whose chosen experts differ as a set.
    pub(crate) differing: usize,
    pub(crate) near_ties: usize,
    pub(crate) divergences: usize,
    /// Differing tokens whose logit error was estimated (the two listed no expert in common).
    pub(crate) estimated_errors: usize,
    /// Tokens that chose alike whose weights differ past the logit error.
    pub(crate) weights_differ: usize,
    /// The token whose weight differs most past what is allowed.
    pub(crate) worst_weights: Option<WorstWeights>,
    /// The largest router-logit error measured on a token of the layer (`null`: none).
    pub(crate) max_logit_error: Option<f64>,
    /// Tokens only one side's call has (by row).
    pub(crate) rows_unmatched: usize,
    /// The routers score by other functions (softmax, sigmoid).
    pub(crate) scoring_differs: bool,
    /// Where the two routers' `[num_experts, top_k]` differ: the reference's and the other's.
    pub(crate) experts_differ: Option<[[usize; 2]; 2]>,
    /// The layer's `mlp_out` stage diverged in some pass.
    pub(crate) mlp_out_diverged: bool,
    /// Routing `same` and `mlp_out` diverged: the experts' computation differs, not their
    /// choice.
    pub(crate) computation_not_choice: bool,
    /// With a floor: the floor's routing against the reference's in this layer.
    pub(crate) floor: Option<FloorRouting>,
    /// With a floor: this layer's differences are no more than the floor's (`null`
    /// without one).
    pub(crate) within_floor: Option<bool>,
    /// The verdict is `routing`, `weights` or `experts_differ`, and not within the floor.
    pub(crate) flagged: bool,
}

/// The floor's routing against the reference's, in one layer.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(crate) struct FloorRouting {
    pub(crate) tokens: usize,
    pub(crate) differing: usize,
    pub(crate) weights_differ: usize,
}

/// The token of a layer whose weight differs most past what the logit error allows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorstWeights {
    pub(crate) pass: Option<usize>,
    pub(crate) row: usize,
    #[serde(flatten)]
    pub(crate) weight: WeightDifference,
    /// The token's router-logit error.
    pub(crate) logit_error: f64,
}

/// One token routed differently in a call.
#[derive(Debug)]
pub(crate) struct DifferingToken<'a> {
    pub(crate) reference: &'a RoutedToken,
    pub(crate) other: &'a RoutedToken,
    pub(crate) verdict: RoutingVerdict,
    pub(crate) error: f64,
    pub(crate) estimated: bool,
}

/// What one call pair differs in, by row.
#[derive(Debug, Default)]
pub(crate) struct CallDifferences<'a> {
    pub(crate) differing: Vec<DifferingToken<'a>>,
}

/// How two tokens of one row compare.
enum TokenOutcome {
    Same,
    Weights(WeightDifference),
    Differ(RoutingVerdict),
}

impl LayerRouting {
    /// Compares one call of the reference (`ours`) with the other's of the same pass; `None`
    /// where their experts counts differ (noted, not compared).
    pub(crate) fn compare_call<'a>(
        &mut self,
        pass: Option<usize>,
        ours: &'a RouterEvent,
        theirs: &'a RouterEvent,
    ) -> Option<CallDifferences<'a>> {
        self.calls += 1;
        if !self.comparable(ours, theirs) {
            return None;
        }
        let mut call = CallDifferences::default();
        for (reference, other, error, estimated) in self.token_pairs(ours, theirs) {
            self.tokens += 1;
            if estimated {
                self.estimated_errors += usize::from(!same_experts(reference, other));
            }
            match outcome(reference, other, error) {
                TokenOutcome::Same => {}
                TokenOutcome::Weights(weight) => {
                    self.weights_differ += 1;
                    let worse = (self.worst_weights.as_ref())
                        .is_none_or(|w| weight.ratio() > w.weight.ratio());
                    if worse {
                        self.worst_weights = Some(WorstWeights {
                            pass,
                            row: reference.row,
                            weight,
                            logit_error: error,
                        });
                    }
                }
                TokenOutcome::Differ(verdict) => {
                    self.differing += 1;
                    match verdict {
                        RoutingVerdict::NearTie => self.near_ties += 1,
                        RoutingVerdict::Divergence => self.divergences += 1,
                    }
                    call.differing.push(DifferingToken {
                        reference,
                        other,
                        verdict,
                        error,
                        estimated,
                    });
                }
            }
        }
        Some(call)
    }

    /// Compares one call of the reference with the floor's, counting the floor's differences.
    pub(crate) fn compare_floor_call(&mut self, ours: &RouterEvent, floors: &RouterEvent) {
        let mut floor = self.floor.unwrap_or_default();
        if ours.num_experts == floors.num_experts && ours.top_k == floors.top_k {
            let mut measured = self.max_logit_error;
            for (reference, other, error, _) in token_pairs(ours, floors, &mut measured) {
                floor.tokens += 1;
                match outcome(reference, other, error) {
                    TokenOutcome::Same => {}
                    TokenOutcome::Weights(_) => floor.weights_differ += 1,
                    TokenOutcome::Differ(_) => floor.differing += 1,
                }
            }
        }
        self.floor = Some(floor);
    }

    /// Whether the two calls can be compared: the same numbers of experts and of experts per
    /// token (else noted); other scoring is noted and compared all the same.
    fn comparable(&mut self, ours: &RouterEvent, theirs: &RouterEvent) -> bool {
        self.scoring_differs |= ours.scoring != theirs.scoring;
        let counts = |call: &RouterEvent| [call.num_experts, call.top_k];
        if counts(ours) == counts(theirs) {
            return true;
        }
        self.experts_differ
            .get_or_insert([counts(ours), counts(theirs)]);
        false
    }

    /// The tokens of two calls matched by row, each with the other's logit error (measured,
    /// or the layer's largest where the two list no expert in common), noting the rows of one
    /// side only and the errors measured.
    fn token_pairs<'a>(
        &mut self,
        ours: &'a RouterEvent,
        theirs: &'a RouterEvent,
    ) -> Vec<(&'a RoutedToken, &'a RoutedToken, f64, bool)> {
        let pairs = token_pairs(ours, theirs, &mut self.max_logit_error);
        self.rows_unmatched +=
            (ours.tokens.len() + theirs.tokens.len()).saturating_sub(2 * pairs.len());
        pairs
    }

    /// The verdict and the flags, once every pass is in: `mlp_out_diverged` whether the
    /// layer's `mlp_out` diverged, `floor` whether a floor was compared.
    pub(crate) fn finish(&mut self, mlp_out_diverged: bool, floor: bool) {
        self.verdict = if self.experts_differ.is_some() && self.tokens == 0 {
            LayerVerdict::ExpertsDiffer
        } else if self.divergences > 0 {
            LayerVerdict::Routing
        } else if self.weights_differ > 0 {
            LayerVerdict::Weights
        } else if self.near_ties > 0 {
            LayerVerdict::NearTies
        } else {
            LayerVerdict::Same
        };
        self.mlp_out_diverged = mlp_out_diverged;
        self.computation_not_choice = mlp_out_diverged && self.verdict == LayerVerdict::Same;
        self.within_floor = floor.then(|| {
            let f = self.floor.unwrap_or_default();
            self.differing <= f.differing && self.weights_differ <= f.weights_differ
        });
        let serious = matches!(
            self.verdict,
            LayerVerdict::Routing | LayerVerdict::Weights | LayerVerdict::ExpertsDiffer
        );
        self.flagged = serious && self.within_floor != Some(true);
    }

    /// What a user should know of this layer that its counts do not say.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some([[e0, k0], [e1, k1]]) = self.experts_differ {
            notes.push(format!(
                "layer {}: the reference's router has {e0} experts, {k0} per token, the other's \
                 {e1} and {k1}: their choices were not compared (another model, or a config \
                 read wrong)",
                self.layer
            ));
        }
        if self.scoring_differs {
            notes.push(format!(
                "layer {}: the two routers score their logits by other functions (softmax, \
                 sigmoid); compared all the same",
                self.layer
            ));
        }
        // Rounding flips a close call now and then; a tenth of the tokens flipping says the
        // router logits themselves are off (its input, or its gate weights).
        if self.tokens >= MANY_NEAR_TIES_OF && self.near_ties * 10 > self.tokens {
            notes.push(format!(
                "layer {}: {} of {} tokens are near-ties, more than rounding flips: the other's \
                 router logits are off by up to {:.2e}, so the router's input or gate weights \
                 may be what differs",
                self.layer,
                self.near_ties,
                self.tokens,
                self.max_logit_error.unwrap_or(f64::NAN)
            ));
        }
        if self.rows_unmatched > 0 {
            notes.push(format!(
                "layer {}: {} tokens are in one trace's router calls only (other rows: another \
                 batch or prompt length)",
                self.layer, self.rows_unmatched
            ));
        }
        notes
    }
}

/// How two tokens of one row compare, with the other's logit error `error`.
fn outcome(reference: &RoutedToken, other: &RoutedToken, error: f64) -> TokenOutcome {
    if !same_experts(reference, other) {
        return TokenOutcome::Differ(judge(reference, error));
    }
    match weights_past_error(reference, other, error) {
        Some(weight) => TokenOutcome::Weights(weight),
        None => TokenOutcome::Same,
    }
}

/// The tokens of two calls matched by row, each with the logit error: measured where the two
/// list an expert in common (the largest such error folded into `measured`), else `measured`
/// after the whole call (0 where none was ever measured) and marked estimated.
fn token_pairs<'a>(
    ours: &'a RouterEvent,
    theirs: &'a RouterEvent,
    measured: &mut Option<f64>,
) -> Vec<(&'a RoutedToken, &'a RoutedToken, f64, bool)> {
    let by_row: BTreeMap<usize, &RoutedToken> = theirs.tokens.iter().map(|t| (t.row, t)).collect();
    let pairs: Vec<(&RoutedToken, &RoutedToken, Option<f64>)> = (ours.tokens.iter())
        .filter_map(|reference| {
            let other = by_row.get(&reference.row)?;
            Some((reference, *other, logit_error(reference, other)))
        })
        .collect();
    for error in pairs.iter().filter_map(|p| p.2).filter(|e| !e.is_nan()) {
        *measured = Some(measured.map_or(error, |m| m.max(error)));
    }
    let estimate = measured.unwrap_or(0.0);
    (pairs.into_iter())
        .map(|(reference, other, error)| match error {
            Some(error) => (reference, other, error, false),
            None => (reference, other, estimate, true),
        })
        .collect()
}
