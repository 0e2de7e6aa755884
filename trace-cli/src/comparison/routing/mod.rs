//! The routers of two traces compared: per layer how many tokens chose other experts and
//! whether the other's router-logit error explains each (a near-tie) or not (a divergence), the
//! tokens whose weights differ past that error, and the first token routed differently.
//!
//! Router calls are matched by pass and layer (and by tracepoint where a layer has several),
//! tokens by row. Folded pass by pass as the traces are read; only counts and the first and
//! worst of each kind are kept. With a floor, the floor's routing is compared with the
//! reference's the same way, and a layer whose differences are no more than the floor's is not
//! flagged.

mod layer;
mod logits;
mod text;
mod token;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use trace_runtime::compare::Tolerances;
use trace_runtime::RouterEvent;

use self::layer::{CallDifferences, DifferingToken, LayerJudging};
pub(crate) use self::layer::{LayerRouting, LayerStages, LayerVerdict};
use self::logits::RouterLogitsJudged;
pub(crate) use self::token::RoutingVerdict;

/// Router calls named in the notes of calls only one trace has, at most.
const LISTED_CALLS: usize = 8;

/// The routing of the traces compared so far, and once finished, what is reported.
#[derive(Debug, Default)]
pub(crate) struct RoutingComparison {
    /// Router calls read: the reference's, the other's, the floor's.
    calls: [usize; 3],
    layers: BTreeMap<usize, LayerRouting>,
    first_difference: Option<TokenDifference>,
    first_divergence: Option<TokenDifference>,
    /// Calls of the reference no call of the other matched, and the reverse.
    unmatched: [usize; 2],
    unmatched_listed: Vec<String>,
    /// The tolerances of the stages, which judge the router logits too.
    tolerances: Tolerances,
    /// The report, once finished.
    report: Option<RoutingReport>,
}

/// One token routed differently.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TokenDifference {
    pub(crate) pass: Option<usize>,
    pub(crate) layer: usize,
    pub(crate) row: usize,
    /// The token's position: the pass's position plus the row (`null` where the pass does not
    /// say its position).
    pub(crate) position: Option<usize>,
    pub(crate) tracepoint: String,
    /// The chosen experts of each run, as its router returned them.
    pub(crate) reference_experts: Vec<u32>,
    pub(crate) other_experts: Vec<u32>,
    pub(crate) verdict: RoutingVerdict,
    /// The reference's `logit_margin`.
    pub(crate) reference_logit_margin: f32,
    /// The other's router-logit error on this token (`null` where NaN, or unknown: the two
    /// list no expert in common, nor did any token of the layer).
    pub(crate) logit_error: Option<f64>,
    /// The two tokens list no expert's logit in common: `logit_error` is the largest measured
    /// on the layer's other tokens (or unknown).
    pub(crate) logit_error_estimated: bool,
}

/// What `diff` reports of the routers (`--json`: `routing`).
#[derive(Debug, Serialize)]
pub(crate) struct RoutingReport {
    /// Router calls in the reference, the other and the floor (`null` without one).
    pub(crate) reference_calls: usize,
    pub(crate) other_calls: usize,
    pub(crate) floor_calls: Option<usize>,
    /// Tokens compared, over every layer and pass.
    pub(crate) tokens: usize,
    /// Of them, those whose chosen experts differ (as a set).
    pub(crate) differing: usize,
    pub(crate) near_ties: usize,
    pub(crate) divergences: usize,
    /// Tokens that chose alike whose weights differ past the logit error.
    pub(crate) weights_differ: usize,
    /// The first token routed differently (pass, then layer, then row); `null`: none.
    pub(crate) first_difference: Option<TokenDifference>,
    /// The first of them judged a divergence; `null`: none.
    pub(crate) first_divergence: Option<TokenDifference>,
    pub(crate) layers: Vec<LayerRouting>,
    /// Router calls of one trace that no call of the other matched.
    pub(crate) only_in_reference: usize,
    pub(crate) only_in_other: usize,
    /// What the user should know that the counts do not say: one side without routers,
    /// unmatched calls, experts counts that differ.
    pub(crate) notes: Vec<String>,
}

impl RoutingReport {
    /// The first layer flagged (its verdict `routing`, `weights`, `router_logits` or
    /// `experts_differ`, and not within the floor); `None`: none.
    pub(crate) fn first_flagged(&self) -> Option<&LayerRouting> {
        self.layers.iter().find(|layer| layer.flagged)
    }

    /// The one line under the stage comparison's headline naming the first flagged layer.
    pub(crate) fn headline(&self) -> Option<String> {
        let first = self.first_flagged()?;
        let flagged = self.layers.iter().filter(|layer| layer.flagged).count();
        Some(format!(
            "routing differs: layer {} first ({}), {flagged} of {} layers flagged",
            first.layer,
            first.verdict.word(),
            self.layers.len()
        ))
    }
}

impl RoutingComparison {
    /// A comparison whose router logits are judged by the stages' `tolerances`
    /// (`layer.N.router_logits` for overrides).
    pub(crate) fn new(tolerances: Tolerances) -> Self {
        Self {
            tolerances,
            ..Self::default()
        }
    }

    /// Folds in one pass's router calls of each trace (`routers`: the reference's, the
    /// other's, the floor's; `None` where a trace has no such pass), `position` the pass's.
    pub(crate) fn pass(
        &mut self,
        pass: Option<usize>,
        position: Option<usize>,
        routers: [Option<&[RouterEvent]>; 3],
    ) {
        for (count, calls) in self.calls.iter_mut().zip(routers) {
            *count += calls.map_or(0, <[RouterEvent]>::len);
        }
        let [reference, other, floor] = routers.map(Option::unwrap_or_default);
        if reference.is_empty() && other.is_empty() {
            return;
        }
        let paired = pair_calls(reference, other);
        self.note_unmatched(pass, &paired);
        for (ours, theirs) in &paired.pairs {
            let Some(call) = self.layer(ours.layer).compare_call(pass, ours, theirs) else {
                continue;
            };
            self.note_first(pass, position, ours, &call);
        }
        if !floor.is_empty() {
            for (ours, floors) in &pair_calls(reference, floor).pairs {
                self.layer(ours.layer).compare_floor_call(ours, floors);
            }
        }
    }

    /// The comparison of `layer` so far (a new one the first time).
    fn layer(&mut self, layer: usize) -> &mut LayerRouting {
        let tolerance = RouterLogitsJudged::tolerance(&self.tolerances, layer);
        self.layers.entry(layer).or_insert_with(|| LayerRouting {
            layer,
            tolerance,
            ..LayerRouting::default()
        })
    }

    /// Notes the first difference and the first divergence of one call, if it has them.
    fn note_first(
        &mut self,
        pass: Option<usize>,
        position: Option<usize>,
        reference: &RouterEvent,
        call: &CallDifferences<'_>,
    ) {
        let difference = |token: &DifferingToken<'_>| TokenDifference {
            pass,
            layer: reference.layer,
            row: token.reference.row,
            position: position.map(|p| p + token.reference.row),
            tracepoint: reference.tracepoint.to_string(),
            reference_experts: token.reference.experts.clone(),
            other_experts: token.other.experts.clone(),
            verdict: token.verdict,
            reference_logit_margin: token.reference.logit_margin,
            logit_error: token.error,
            logit_error_estimated: token.estimated,
        };
        if self.first_difference.is_none() {
            self.first_difference = call.differing.first().map(difference);
        }
        if self.first_divergence.is_none() {
            self.first_divergence = (call.differing.iter())
                .find(|d| d.verdict == RoutingVerdict::Divergence)
                .map(difference);
        }
    }

    /// Counts the calls only one trace has in a pass, naming the first few.
    fn note_unmatched(&mut self, pass: Option<usize>, paired: &PairedCalls<'_>) {
        for (at, (calls, side)) in [
            (&paired.only_reference, "the reference"),
            (&paired.only_other, "the other"),
        ]
        .into_iter()
        .enumerate()
        {
            self.unmatched[at] += calls.len();
            for call in calls {
                if self.unmatched_listed.len() < LISTED_CALLS {
                    self.unmatched_listed.push(format!(
                        "{}layer {}, {}: only in {side}",
                        pass.map_or_else(String::new, |p| format!("pass {p}, ")),
                        call.layer,
                        call.tracepoint
                    ));
                }
            }
        }
    }

    /// Ends the comparison: each layer's verdict, with `stages` what each layer's `mlp_in` and
    /// `mlp_out` did, and `floor_factor` where a floor was compared; nothing to report when
    /// neither trace has router calls.
    pub(crate) fn finish(
        &mut self,
        stages: &BTreeMap<usize, LayerStages>,
        floor_factor: Option<f64>,
    ) {
        let floor = floor_factor.is_some();
        let [reference_calls, other_calls, floor_calls] = self.calls;
        if reference_calls == 0 && other_calls == 0 {
            return;
        }
        let mut layers: Vec<LayerRouting> =
            std::mem::take(&mut self.layers).into_values().collect();
        for layer in &mut layers {
            layer.finish(&LayerJudging {
                stages: stages.get(&layer.layer).copied().unwrap_or_default(),
                tolerances: &self.tolerances,
                floor_factor,
            });
        }
        let sum = |count: fn(&LayerRouting) -> usize| layers.iter().map(count).sum();
        let report = RoutingReport {
            reference_calls,
            other_calls,
            floor_calls: floor.then_some(floor_calls),
            tokens: sum(|l| l.tokens),
            differing: sum(|l| l.differing),
            near_ties: sum(|l| l.near_ties),
            divergences: sum(|l| l.divergences),
            weights_differ: sum(|l| l.weights_differ),
            first_difference: self.first_difference.take(),
            first_divergence: self.first_divergence.take(),
            notes: self.notes(&layers, floor),
            layers,
            only_in_reference: self.unmatched[0],
            only_in_other: self.unmatched[1],
        };
        self.report = Some(report);
    }

    /// The notes of a finished comparison.
    fn notes(&self, layers: &[LayerRouting], floor: bool) -> Vec<String> {
        let [reference_calls, other_calls, floor_calls] = self.calls;
        let mut notes = Vec::new();
        let one_side = |has: &str, lacks: &str, calls: usize| {
            format!(
                "{has} recorded {calls} router calls and {lacks} none: routing not compared \
                 (record the routers on both sides: #[trace_router], or the Python tracer's \
                 routers)"
            )
        };
        if other_calls == 0 {
            notes.push(one_side("the reference", "the other", reference_calls));
        } else if reference_calls == 0 {
            notes.push(one_side("the other", "the reference", other_calls));
        }
        if floor && floor_calls == 0 && reference_calls > 0 {
            notes.push(
                "the floor recorded no router calls: no layer's routing is excused by it"
                    .to_owned(),
            );
        }
        let unmatched = self.unmatched[0] + self.unmatched[1];
        if unmatched > 0 && reference_calls > 0 && other_calls > 0 {
            let more = unmatched.saturating_sub(self.unmatched_listed.len());
            let more = if more > 0 {
                format!(", ... and {more} more")
            } else {
                String::new()
            };
            notes.push(format!(
                "{unmatched} router calls matched none of the other trace (by pass, layer and \
                 tracepoint): {}{more}",
                self.unmatched_listed.join(", ")
            ));
        }
        for layer in layers {
            notes.extend(layer.notes());
        }
        notes
    }

    /// What to report; `None` when neither trace has router calls.
    pub(crate) fn report(&self) -> Option<&RoutingReport> {
        self.report.as_ref()
    }
}

/// The router calls of one pass of two traces, paired.
struct PairedCalls<'a> {
    pairs: Vec<(&'a RouterEvent, &'a RouterEvent)>,
    only_reference: Vec<&'a RouterEvent>,
    only_other: Vec<&'a RouterEvent>,
}

/// Pairs the calls of one pass of two traces by layer, in layer order: where each trace has
/// one router tracepoint in a layer, its calls in order (the tracepoints may be named
/// differently by two implementations); where either has several, by tracepoint, then in order.
fn pair_calls<'a>(reference: &'a [RouterEvent], other: &'a [RouterEvent]) -> PairedCalls<'a> {
    let by_layer = |calls: &'a [RouterEvent]| {
        let mut layers: BTreeMap<usize, Vec<&'a RouterEvent>> = BTreeMap::new();
        for call in calls {
            layers.entry(call.layer).or_default().push(call);
        }
        layers
    };
    let (mut ours, mut theirs) = (by_layer(reference), by_layer(other));
    let layers: BTreeSet<usize> = ours.keys().chain(theirs.keys()).copied().collect();
    let mut paired = PairedCalls {
        pairs: Vec::new(),
        only_reference: Vec::new(),
        only_other: Vec::new(),
    };
    for layer in layers {
        let ours = ours.remove(&layer).unwrap_or_default();
        let theirs = theirs.remove(&layer).unwrap_or_default();
        let tracepoints = |calls: &[&RouterEvent]| {
            (calls.iter())
                .map(|c| c.tracepoint.as_ref())
                .collect::<BTreeSet<&str>>()
                .len()
        };
        if tracepoints(&ours) <= 1 && tracepoints(&theirs) <= 1 {
            pair_in_order(&ours, &theirs, &mut paired);
            continue;
        }
        let names: BTreeSet<&str> = (ours.iter().chain(&theirs))
            .map(|c| c.tracepoint.as_ref())
            .collect();
        for name in names {
            let of = |calls: &[&'a RouterEvent]| -> Vec<&'a RouterEvent> {
                calls
                    .iter()
                    .copied()
                    .filter(|c| c.tracepoint == name)
                    .collect()
            };
            pair_in_order(&of(&ours), &of(&theirs), &mut paired);
        }
    }
    paired
}

/// Pairs two lists of calls in order; the rest of the longer one is unmatched.
fn pair_in_order<'a>(
    ours: &[&'a RouterEvent],
    theirs: &[&'a RouterEvent],
    paired: &mut PairedCalls<'a>,
) {
    paired
        .pairs
        .extend(ours.iter().copied().zip(theirs.iter().copied()));
    paired
        .only_reference
        .extend(ours.iter().skip(theirs.len()).copied());
    paired
        .only_other
        .extend(theirs.iter().skip(ours.len()).copied());
}
