//! One layer's routers compared over every pass: the tokens compared, those routed
//! differently and how, those whose weights differ, and the layer's verdict.

use std::collections::BTreeMap;

use serde::Serialize;
use trace_runtime::compare::{Tolerance, Tolerances};
use trace_runtime::{RoutedToken, RouterEvent, RouterScoring};

use super::logits::{LogitErrors, RouterLogitsJudged};
use super::token::{
    judge, logit_error, same_experts, shifted_common_logits, weights_past_error, RoutingVerdict,
    WeightDifference,
};

/// How many times its `mlp_in`'s ratio (error over what the tolerance allows) `mlp_out`'s must
/// be, in a pass, for its divergence to be the layer's own, not its input's carried through the
/// experts (a smooth map, which amplifies its input's relative error by a modest factor).
/// Measured (`diff --json`, `mlp_out_gain`, on the traces of `python/tests/test_moe_port.py`): a
/// layer after a bug's, routing the same, at most 6.1 (8.9 with near-ties, 67 where a near-tie
/// flipped an expert); a layer whose own experts' weights or weighting are wrong, 2·10⁴ to 7·10⁷.
const EXPERTS_OWN_GAIN: f64 = 100.0;

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
    /// No divergence, no weights past the logit error, but the router logits are beyond the
    /// stages' tolerance while the router's input (`mlp_in`) is within it (or not traced): the
    /// router's own computation differs, and its near-ties are explained by that error.
    RouterLogits,
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
            Self::RouterLogits => "router logits",
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
    /// Differing tokens whose logit error was estimated (the two listed no expert in common):
    /// the layer's largest measured.
    pub(crate) estimated_errors: usize,
    /// Differing tokens whose logit error is unknown (the two listed no expert in common, nor
    /// did any token of the layer): each a divergence (see `judge`).
    pub(crate) unknown_errors: usize,
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
    /// The router logits judged as a stage (`null`: no logit listed by both runs).
    pub(crate) router_logits: Option<RouterLogitsJudged>,
    /// The layer's `mlp_out` stage diverged in some pass.
    pub(crate) mlp_out_diverged: bool,
    /// Where it diverged, the largest of its ratio over `mlp_in`'s in the same pass (`null`:
    /// no divergence, or no `mlp_in`).
    pub(crate) mlp_out_gain: Option<f64>,
    /// Routing `same` and `mlp_out` diverged in a pass by over [`EXPERTS_OWN_GAIN`] times its
    /// `mlp_in`'s ratio (the layer's own divergence, not an earlier one's carried through):
    /// the experts' computation differs, not their choice.
    pub(crate) computation_not_choice: bool,
    /// With a floor: the floor's routing against the reference's in this layer.
    pub(crate) floor: Option<FloorRouting>,
    /// With a floor: this layer's divergences no more than the floor's, its near-ties no more
    /// than the floor's differing tokens, its weights differences no more than the floor's, its
    /// router logits not its own error against the floor's (`null` without one).
    pub(crate) within_floor: Option<bool>,
    /// The verdict is `routing`, `weights`, `router_logits` or `experts_differ`, and not
    /// within the floor.
    pub(crate) flagged: bool,
    /// The tolerance of each of the layer's router logits (`layer.N.router_logits`).
    #[serde(skip)]
    pub(crate) tolerance: Tolerance,
    /// The other's router logits against the reference's, and the floor's.
    #[serde(skip)]
    pub(crate) logit_errors: LogitErrors,
    #[serde(skip)]
    pub(crate) floor_logit_errors: LogitErrors,
}

/// What the stages of a layer did, over every pass, for the routing's verdicts; ratios are a
/// stage's error over what the tolerance allows (above 1 diverged).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LayerStages {
    /// `mlp_in`'s (the router's input) worst ratio over the passes; `None`: not compared.
    pub(crate) mlp_in_ratio: Option<f64>,
    /// `mlp_out` diverged in some pass.
    pub(crate) mlp_out_diverged: bool,
    /// Over the passes where `mlp_out` diverged and `mlp_in` was compared, the largest of
    /// `mlp_out`'s ratio over `mlp_in`'s in the same pass.
    pub(crate) mlp_out_gain: Option<f64>,
}

/// How a layer's verdict is reached, once every pass is in.
pub(crate) struct LayerJudging<'a> {
    pub(crate) stages: LayerStages,
    pub(crate) tolerances: &'a Tolerances,
    /// With a floor: how many times the floor's error the other may have.
    pub(crate) floor_factor: Option<f64>,
}

/// The floor's routing against the reference's, in one layer.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(crate) struct FloorRouting {
    pub(crate) tokens: usize,
    pub(crate) differing: usize,
    pub(crate) near_ties: usize,
    pub(crate) divergences: usize,
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
    /// The other's logit error (`None`: unknown).
    pub(crate) error: Option<f64>,
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
            if !same_experts(reference, other) {
                self.estimated_errors += usize::from(estimated && error.is_some());
                self.unknown_errors += usize::from(error.is_none());
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
                            logit_error: error.unwrap_or(f64::NAN),
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
            let mut measured = None;
            let mut logits = LogitMeasure {
                errors: &mut self.floor_logit_errors,
                tolerance: self.tolerance,
                largest: &mut measured,
            };
            for (reference, other, error, _) in token_pairs(ours, floors, &mut logits) {
                floor.tokens += 1;
                match outcome(reference, other, error) {
                    TokenOutcome::Same => {}
                    TokenOutcome::Weights(_) => floor.weights_differ += 1,
                    TokenOutcome::Differ(verdict) => {
                        floor.differing += 1;
                        match verdict {
                            RoutingVerdict::NearTie => floor.near_ties += 1,
                            RoutingVerdict::Divergence => floor.divergences += 1,
                        }
                    }
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
    /// or the layer's largest where the two list no expert in common, `None` where none was
    /// measured), noting the rows of one side only and the logits compared.
    fn token_pairs<'a>(
        &mut self,
        ours: &'a RouterEvent,
        theirs: &'a RouterEvent,
    ) -> Vec<TokenPair<'a>> {
        let mut logits = LogitMeasure {
            errors: &mut self.logit_errors,
            tolerance: self.tolerance,
            largest: &mut self.max_logit_error,
        };
        let pairs = token_pairs(ours, theirs, &mut logits);
        self.rows_unmatched +=
            (ours.tokens.len() + theirs.tokens.len()).saturating_sub(2 * pairs.len());
        pairs
    }

    /// The verdict and the flags, once every pass is in (see [`LayerJudging`]).
    pub(crate) fn finish(&mut self, judging: &LayerJudging<'_>) {
        let stages = judging.stages;
        let floor = (judging.floor_factor).map(|factor| (&self.floor_logit_errors, factor));
        self.router_logits = RouterLogitsJudged::judge(
            self.layer,
            &self.logit_errors,
            floor,
            judging.tolerances,
            stages.mlp_in_ratio,
        );
        let own_logits = self.router_logits.as_ref().is_some_and(|l| l.own_error);
        self.verdict = if self.experts_differ.is_some() && self.tokens == 0 {
            LayerVerdict::ExpertsDiffer
        } else if self.divergences > 0 {
            LayerVerdict::Routing
        } else if self.weights_differ > 0 {
            LayerVerdict::Weights
        } else if own_logits {
            LayerVerdict::RouterLogits
        } else if self.near_ties > 0 {
            LayerVerdict::NearTies
        } else {
            LayerVerdict::Same
        };
        self.mlp_out_diverged = stages.mlp_out_diverged;
        self.mlp_out_gain = stages.mlp_out_gain;
        self.computation_not_choice = self.verdict == LayerVerdict::Same
            && (stages.mlp_out_gain).is_some_and(|gain| gain > EXPERTS_OWN_GAIN);
        let floor = judging.floor_factor.is_some();
        self.within_floor = floor.then(|| {
            let f = self.floor.unwrap_or_default();
            // A divergence is excused only by as many of the floor's; a near-tie by any of its
            // differences. The router logits were judged against the floor's already.
            self.divergences <= f.divergences
                && self.near_ties <= f.differing
                && self.weights_differ <= f.weights_differ
                && !own_logits
        });
        let serious = !matches!(self.verdict, LayerVerdict::Same | LayerVerdict::NearTies);
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
        if self.unknown_errors > 0 {
            notes.push(format!(
                "layer {}: {} tokens chose experts of which the other lists none the reference \
                 lists, and no token of the layer lists an expert on both sides: the other's \
                 router-logit error is unknown, and each is counted a divergence (a rounding \
                 error flips the closest choice; it does not replace every listed expert)",
                self.layer, self.unknown_errors
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

/// How two tokens of one row compare, with the other's logit error `error` (`None`: unknown,
/// which only tokens that list no expert in common have).
fn outcome(reference: &RoutedToken, other: &RoutedToken, error: Option<f64>) -> TokenOutcome {
    if !same_experts(reference, other) {
        return TokenOutcome::Differ(judge(reference, error));
    }
    match error.and_then(|error| weights_past_error(reference, other, error)) {
        Some(weight) => TokenOutcome::Weights(weight),
        None => TokenOutcome::Same,
    }
}

/// Two tokens of one row, the other's logit error on them (`None`: unknown) and whether it was
/// estimated (not measured on them).
type TokenPair<'a> = (&'a RoutedToken, &'a RoutedToken, Option<f64>, bool);

/// Where the logits of token pairs are folded: every logit both list, and the largest error.
struct LogitMeasure<'a> {
    errors: &'a mut LogitErrors,
    tolerance: Tolerance,
    largest: &'a mut Option<f64>,
}

/// The tokens of two calls matched by row, each with the logit error: measured where the two
/// list an expert in common (each such logit and the largest error folded into `measure`),
/// else the largest measured in the layer after the whole call, marked estimated, or `None`
/// where none was ever measured: unknown, never 0.
fn token_pairs<'a>(
    ours: &'a RouterEvent,
    theirs: &'a RouterEvent,
    measure: &mut LogitMeasure<'_>,
) -> Vec<TokenPair<'a>> {
    let by_row: BTreeMap<usize, &RoutedToken> = theirs.tokens.iter().map(|t| (t.row, t)).collect();
    // Two softmax routers are the same router up to a per-token shift of their logits.
    let shift_free = [ours.scoring, theirs.scoring] == [RouterScoring::Softmax; 2];
    let pairs: Vec<(&RoutedToken, &RoutedToken, Option<f64>)> = (ours.tokens.iter())
        .filter_map(|reference| {
            let other = by_row.get(&reference.row)?;
            for (a, b, recorded) in shifted_common_logits(reference, other, shift_free) {
                measure.errors.add(a, b, recorded, measure.tolerance);
            }
            Some((reference, *other, logit_error(reference, other, shift_free)))
        })
        .collect();
    for error in pairs.iter().filter_map(|p| p.2).filter(|e| !e.is_nan()) {
        *measure.largest = Some(measure.largest.map_or(error, |m| m.max(error)));
    }
    let estimate = *measure.largest;
    (pairs.into_iter())
        .map(|(reference, other, error)| match error {
            Some(error) => (reference, other, Some(error), false),
            None => (reference, other, estimate, true),
        })
        .collect()
}
