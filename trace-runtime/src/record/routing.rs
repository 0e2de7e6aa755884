//! How close a router's choice was: from one token's router logits and the experts it chose,
//! the selection scores, the runner-up, the margins and the per-call load of a
//! [`RouterEvent`](super::RouterEvent). Pure functions of their inputs, computed in `f64`.
//!
//! The margins are those of `docs/trace-format.md` (section `router`). `logit_margin` is solved
//! for the pairs that decide the choice: the weakest chosen expert against the runner-up (in
//! closed form, `(l_weakest − l_runner_up) / 2`, without a selection bias, where both scorings
//! are monotone in the logit gap; numerically with one), and for a grouped router also the
//! weakest chosen group against the best other one (numerically), the smaller of the two.

use super::{ExpertGroups, RoutedToken, RouterScoring};

/// How a router chooses its experts: what a token's margins are computed by.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoutingRule<'a> {
    /// How logits become selection scores.
    pub scoring: RouterScoring,
    /// The selection bias, one value per expert, added to the scores to choose experts.
    pub bias: Option<&'a [f32]>,
    /// Grouped top-k.
    pub groups: Option<ExpertGroups>,
}

impl RoutingRule<'_> {
    /// Why this rule cannot route `num_experts` experts (a bias of another length, groups that
    /// do not split them), or `Ok`.
    pub fn check(&self, num_experts: usize) -> Result<(), String> {
        if let Some(bias) = self.bias {
            if bias.len() != num_experts {
                return Err(format!(
                    "the selection bias has {} values for {num_experts} experts",
                    bias.len()
                ));
            }
        }
        if let Some(ExpertGroups { groups, top_groups }) = self.groups {
            if groups == 0 || !num_experts.is_multiple_of(groups) {
                return Err(format!(
                    "groups = ({groups}, {top_groups}): {num_experts} experts do not split \
                     into {groups} groups of equal size"
                ));
            }
            if top_groups == 0 || top_groups > groups {
                return Err(format!(
                    "groups = ({groups}, {top_groups}): the groups chosen must be 1 to {groups}"
                ));
            }
        }
        Ok(())
    }
}

/// Tokens routed to each expert over a call: `experts` holds every token's chosen ids, and an
/// id past `num_experts` is not counted (the hook refuses such a call first).
pub fn expert_load(num_experts: usize, experts: &[u32]) -> Vec<usize> {
    let mut load = vec![0; num_experts];
    for &expert in experts {
        if let Some(count) = load.get_mut(expert as usize) {
            *count += 1;
        }
    }
    load
}

/// The largest logit shift solved for: past it (a router logit moved by 600) the
/// choice is taken as unchangeable (`logit_margin` infinite), and `exp` stays finite in `f64`.
const MAX_SHIFT: f64 = 600.0;
/// Steps of the root finder at most: it ends at `f64` precision in far fewer (each halving or
/// better once bracketed), this only bounds a pathological gap.
const MAX_STEPS: usize = 200;

impl RoutedToken {
    /// One token's routing: `logits` (one per expert) and the `experts` the router chose with
    /// their `weights`, as the router returned them; `row` its row in the call. The rule must
    /// pass [`RoutingRule::check`] for `logits.len()` experts, and every id be below it.
    pub fn from_routing(
        rule: &RoutingRule<'_>,
        row: usize,
        logits: &[f32],
        experts: &[u32],
        weights: &[f32],
    ) -> Self {
        let scores = selection_scores(rule, logits);
        let mut chosen = vec![false; logits.len()];
        for &expert in experts {
            chosen[expert as usize] = true;
        }
        let groups = rule
            .groups
            .map(|groups| GroupChoice::new(groups, &scores, &chosen));
        let eligible = |expert: usize| groups.as_ref().is_none_or(|g| g.holds(expert));
        let runner_up = best(
            &scores,
            (0..scores.len()).filter(|&e| !chosen[e] && eligible(e)),
        );
        let weakest = weakest(&scores, experts.iter().map(|&e| e as usize));
        let margin = match (weakest, runner_up) {
            (Some(weakest), Some(runner_up)) => scores[weakest] - scores[runner_up],
            _ => f64::INFINITY,
        };
        let margin = if experts.iter().any(|&e| scores[e as usize].is_nan()) {
            f64::NAN
        } else {
            margin
        };
        let group_margin = groups.as_ref().and_then(GroupChoice::margin);
        let logit_margin = logit_margin(
            rule,
            logits,
            (margin, group_margin),
            weakest.zip(runner_up),
            groups.as_ref(),
        );
        let mut token_logits: Vec<f32> = experts.iter().map(|&e| logits[e as usize]).collect();
        token_logits.extend(runner_up.map(|e| logits[e]));
        RoutedToken {
            row,
            experts: experts.to_vec(),
            weights: weights.to_vec(),
            runner_up: runner_up.map(|e| e as u32),
            margin: margin as f32,
            group_margin: group_margin.map(|m| m as f32),
            logit_margin: logit_margin as f32,
            logits: token_logits,
        }
    }
}

/// `softmax(logits)` or `sigmoid(logits)`, plus the bias. A NaN logit makes every softmax score
/// NaN, as it does in the frameworks.
fn selection_scores(rule: &RoutingRule<'_>, logits: &[f32]) -> Vec<f64> {
    let mut scores: Vec<f64> = match rule.scoring {
        RouterScoring::Softmax => softmax(logits),
        RouterScoring::Sigmoid => logits.iter().map(|&l| sigmoid(f64::from(l))).collect(),
    };
    if let Some(bias) = rule.bias {
        for (score, &bias) in scores.iter_mut().zip(bias) {
            *score += f64::from(bias);
        }
    }
    scores
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    if logits.iter().any(|l| l.is_nan()) {
        return vec![f64::NAN; logits.len()];
    }
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
    let exps: Vec<f64> = logits.iter().map(|&l| (f64::from(l) - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// How a candidate ranks: NaN below everything, so that a NaN is never preferred.
fn rank(score: f64) -> f64 {
    if score.is_nan() {
        f64::NEG_INFINITY
    } else {
        score
    }
}

/// The best of `candidates` by score, the lowest id among equals.
fn best(scores: &[f64], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    candidates.fold(None, |best: Option<usize>, e| match best {
        Some(b) if rank(scores[b]) >= rank(scores[e]) => Some(b),
        _ => Some(e),
    })
}

/// The weakest of `candidates` by score, the first among equals.
fn weakest(scores: &[f64], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    candidates.fold(None, |weakest: Option<usize>, e| match weakest {
        Some(w) if rank(scores[w]) <= rank(scores[e]) => Some(w),
        _ => Some(e),
    })
}

/// Sum of the two best values (fewer in a group of one); NaN when one is NaN.
fn top_two_sum(values: impl Iterator<Item = f64>) -> f64 {
    let (mut first, mut second) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let mut count = 0;
    for value in values {
        if value.is_nan() {
            return f64::NAN;
        }
        count += 1;
        if value > first {
            second = first;
            first = value;
        } else if value > second {
            second = value;
        }
    }
    match count {
        0 => f64::NAN,
        1 => first,
        _ => first + second,
    }
}

/// The groups of a grouped router: each one's score, and which were chosen: those holding a
/// chosen expert, completed by the best others up to `top_groups`.
struct GroupChoice {
    size: usize,
    scores: Vec<f64>,
    chosen: Vec<bool>,
}

impl GroupChoice {
    fn new(groups: ExpertGroups, scores: &[f64], chosen_experts: &[bool]) -> Self {
        let size = scores.len() / groups.groups;
        let group_scores: Vec<f64> = scores
            .chunks(size)
            .map(|group| top_two_sum(group.iter().copied()))
            .collect();
        let mut chosen: Vec<bool> = chosen_experts
            .chunks(size)
            .map(|group| group.contains(&true))
            .collect();
        while chosen.iter().filter(|&&c| c).count() < groups.top_groups {
            let other = (0..chosen.len()).filter(|&g| !chosen[g]);
            let Some(next) = best(&group_scores, other) else {
                break;
            };
            chosen[next] = true;
        }
        GroupChoice {
            size,
            scores: group_scores,
            chosen,
        }
    }

    fn holds(&self, expert: usize) -> bool {
        self.chosen[expert / self.size]
    }

    fn weakest_chosen(&self) -> Option<usize> {
        let chosen = (0..self.chosen.len()).filter(|&g| self.chosen[g]);
        weakest(&self.scores, chosen)
    }

    fn best_other(&self) -> Option<usize> {
        best(
            &self.scores,
            (0..self.chosen.len()).filter(|&g| !self.chosen[g]),
        )
    }

    /// The weakest chosen group's score minus the best other's; `None` when every group was
    /// chosen; NaN when a group score is NaN.
    fn margin(&self) -> Option<f64> {
        let other = self.best_other()?;
        let weakest = self.weakest_chosen()?;
        if self.scores.iter().any(|s| s.is_nan()) {
            return Some(f64::NAN);
        }
        Some(self.scores[weakest] - self.scores[other])
    }

    fn experts(&self, group: usize) -> std::ops::Range<usize> {
        group * self.size..(group + 1) * self.size
    }
}

/// The smallest logit shift that changes the choice: NaN when a margin is NaN, 0 when one is
/// not positive, infinite when nothing can (every expert chosen, or no shift up to
/// [`MAX_SHIFT`] does).
fn logit_margin(
    rule: &RoutingRule<'_>,
    logits: &[f32],
    (margin, group_margin): (f64, Option<f64>),
    pair: Option<(usize, usize)>,
    groups: Option<&GroupChoice>,
) -> f64 {
    let margins = [margin, group_margin.unwrap_or(f64::INFINITY)];
    if margins.iter().any(|m| m.is_nan()) {
        return f64::NAN;
    }
    if margins.iter().any(|&m| m <= 0.0) {
        return 0.0;
    }
    let shift = Shift::new(rule, logits);
    let experts = pair.map_or(f64::INFINITY, |(weakest, runner_up)| {
        shift.expert_pair(weakest, runner_up)
    });
    let groups = groups
        .and_then(|g| Some((g, g.weakest_chosen()?, g.best_other()?)))
        .map_or(f64::INFINITY, |(g, weakest, other)| {
            shift.group_pair(g, weakest, other, experts)
        });
    experts.min(groups)
}

/// The scores of a token's logits moved by a shift, to find the smallest that changes the
/// choice. Softmax scores depend on every logit through the normaliser: the logits outside the
/// pair move by the same shift, up or down, whichever narrows the gap more.
struct Shift<'a> {
    rule: &'a RoutingRule<'a>,
    /// The logits minus their maximum (softmax) or as they are (sigmoid), in `f64`.
    logits: Vec<f64>,
}

impl<'a> Shift<'a> {
    fn new(rule: &'a RoutingRule<'a>, logits: &[f32]) -> Self {
        let max = match rule.scoring {
            RouterScoring::Softmax => logits
                .iter()
                .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l))),
            RouterScoring::Sigmoid => 0.0,
        };
        let logits = logits.iter().map(|&l| f64::from(l) - max).collect();
        Shift { rule, logits }
    }

    fn bias(&self, expert: usize) -> f64 {
        self.rule.bias.map_or(0.0, |bias| f64::from(bias[expert]))
    }

    /// The weakest chosen expert moved down and the runner-up up: in closed form without a
    /// bias (both scorings order experts as their logits), else numerically.
    fn expert_pair(&self, weakest: usize, runner_up: usize) -> f64 {
        let (a, r) = (self.logits[weakest], self.logits[runner_up]);
        if self.rule.bias.is_none() {
            return (a - r) / 2.0;
        }
        let (bias_a, bias_r) = (self.bias(weakest), self.bias(runner_up));
        let others = match self.rule.scoring {
            RouterScoring::Softmax => self.exp_sum_except(&[weakest, runner_up]),
            RouterScoring::Sigmoid => 0.0,
        };
        let gap = |delta: f64| match self.rule.scoring {
            RouterScoring::Sigmoid => sigmoid(a - delta) + bias_a - sigmoid(r + delta) - bias_r,
            RouterScoring::Softmax => {
                let (ea, er) = ((a - delta).exp(), (r + delta).exp());
                let narrowest = |others: f64| (ea - er) / (ea + er + others);
                narrowest(others * delta.exp()).min(narrowest(others * (-delta).exp())) + bias_a
                    - bias_r
            }
        };
        smallest_crossing(gap, f64::INFINITY)
    }

    /// Every logit of the weakest chosen group moved down and of the best other group up;
    /// `bound`: a shift known to change the choice already (no need to look past it).
    fn group_pair(&self, groups: &GroupChoice, weakest: usize, other: usize, bound: f64) -> f64 {
        let (down, up) = (groups.experts(weakest), groups.experts(other));
        let group_score = |experts: std::ops::Range<usize>, delta: f64, norm: f64| {
            let scores = experts.map(|e| self.score(self.logits[e] + delta, norm) + self.bias(e));
            top_two_sum(scores)
        };
        let outside: Vec<usize> = down.clone().chain(up.clone()).collect();
        let others = match self.rule.scoring {
            RouterScoring::Softmax => self.exp_sum_except(&outside),
            RouterScoring::Sigmoid => 0.0,
        };
        let exp_sum = |experts: std::ops::Range<usize>, delta: f64| -> f64 {
            experts.map(|e| (self.logits[e] + delta).exp()).sum()
        };
        let gap_with = |norm: f64, delta: f64| {
            group_score(down.clone(), -delta, norm) - group_score(up.clone(), delta, norm)
        };
        let gap = |delta: f64| match self.rule.scoring {
            RouterScoring::Sigmoid => gap_with(1.0, delta),
            RouterScoring::Softmax => {
                let pair = exp_sum(down.clone(), -delta) + exp_sum(up.clone(), delta);
                let up_norm = pair + others * delta.exp();
                let down_norm = pair + others * (-delta).exp();
                gap_with(up_norm, delta).min(gap_with(down_norm, delta))
            }
        };
        if bound.is_finite() && gap(bound) > 0.0 {
            return f64::INFINITY;
        }
        smallest_crossing(gap, bound)
    }

    /// A score from a shifted logit; `norm` is softmax's normaliser.
    fn score(&self, logit: f64, norm: f64) -> f64 {
        match self.rule.scoring {
            RouterScoring::Softmax => logit.exp() / norm,
            RouterScoring::Sigmoid => sigmoid(logit),
        }
    }

    fn exp_sum_except(&self, except: &[usize]) -> f64 {
        (0..self.logits.len())
            .filter(|e| !except.contains(e))
            .map(|e| self.logits[e].exp())
            .sum()
    }
}

/// The smallest `delta ≥ 0` where the non-increasing `gap` reaches 0, and no larger than
/// `bound` (a crossing already known there); infinite when none does by [`MAX_SHIFT`]. The
/// crossing is bracketed by doubling, then found by the Illinois method (regula falsi that
/// halves the weight of an end kept twice): a few evaluations to `f64` precision where
/// bisection takes sixty.
fn smallest_crossing(gap: impl Fn(f64) -> f64, bound: f64) -> f64 {
    let at_zero = gap(0.0);
    if at_zero <= 0.0 {
        return 0.0;
    }
    let (mut low, mut gap_low) = (0.0, at_zero);
    let (mut high, mut gap_high) = if bound.is_finite() {
        (bound, gap(bound))
    } else {
        (1.0_f64.min(MAX_SHIFT), gap(1.0_f64.min(MAX_SHIFT)))
    };
    while gap_high > 0.0 {
        if high >= MAX_SHIFT {
            return f64::INFINITY;
        }
        (low, gap_low) = (high, gap_high);
        high = (high * 2.0).min(MAX_SHIFT);
        gap_high = gap(high);
    }
    let mut kept = 0i8;
    for _ in 0..MAX_STEPS {
        if high - low <= high * f64::EPSILON * 4.0 {
            break;
        }
        let secant = high - gap_high * (high - low) / (gap_high - gap_low);
        // A step that does not land inside (a flat or NaN gap) halves instead.
        let mid = if secant > low && secant < high {
            secant
        } else {
            0.5 * (low + high)
        };
        let at_mid = gap(mid);
        if at_mid > 0.0 {
            (low, gap_low) = (mid, at_mid);
            if kept > 0 {
                gap_high *= 0.5;
            }
            kept = kept.max(0) + 1;
        } else {
            (high, gap_high) = (mid, at_mid);
            if kept < 0 {
                gap_low *= 0.5;
            }
            kept = kept.min(0) - 1;
        }
    }
    high
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOFTMAX: RoutingRule<'static> = RoutingRule {
        scoring: RouterScoring::Softmax,
        bias: None,
        groups: None,
    };

    fn token(rule: &RoutingRule<'_>, logits: &[f32], experts: &[u32]) -> RoutedToken {
        let weights = vec![0.5; experts.len()];
        RoutedToken::from_routing(rule, 0, logits, experts, &weights)
    }

    /// `(a − b) / 2` as the margins compute it: in `f64` from the `f32` logits.
    fn half_gap(a: f32, b: f32) -> f32 {
        ((f64::from(a) - f64::from(b)) / 2.0) as f32
    }

    fn probs(logits: &[f32]) -> Vec<f64> {
        softmax(logits)
    }

    /// The token's logits with the weakest chosen expert moved down by `delta`, the runner-up
    /// up, and every other logit moved by `others`.
    fn shifted(logits: &[f32], down: &[usize], up: &[usize], delta: f32, others: f32) -> Vec<f32> {
        let mut moved = logits.to_vec();
        for (e, l) in moved.iter_mut().enumerate() {
            *l += if down.contains(&e) {
                -delta
            } else if up.contains(&e) {
                delta
            } else {
                others
            };
        }
        moved
    }

    #[test]
    fn softmax_without_bias_gives_the_half_logit_gap() {
        let logits = [2.0, 1.0, 0.5, -1.0];
        let t = token(&SOFTMAX, &logits, &[0, 1]);
        let p = probs(&logits);
        assert_eq!(t.runner_up, Some(2));
        assert_eq!(t.margin, (p[1] - p[2]) as f32);
        assert_eq!(t.logit_margin, 0.25);
        assert_eq!(t.logits, [2.0, 1.0, 0.5]);
        assert_eq!(t.group_margin, None);
        // the order the router returned its experts in changes nothing but the order
        let swapped = token(&SOFTMAX, &logits, &[1, 0]);
        assert_eq!(
            (swapped.margin, swapped.logit_margin),
            (t.margin, t.logit_margin)
        );
        assert_eq!(swapped.logits, [1.0, 2.0, 0.5]);
    }

    #[test]
    fn experts_that_are_not_the_top_k_give_a_negative_margin_and_no_logit_margin() {
        let logits = [2.0, 1.0, 0.5, -1.0];
        let t = token(&SOFTMAX, &logits, &[0, 3]);
        let p = probs(&logits);
        assert_eq!(t.runner_up, Some(1));
        assert_eq!(t.margin, (p[3] - p[1]) as f32);
        assert!(t.margin < 0.0);
        assert_eq!(t.logit_margin, 0.0);
    }

    #[test]
    fn nan_logits_give_nan_margins() {
        let t = token(&SOFTMAX, &[2.0, f32::NAN, 0.5, -1.0], &[0, 2]);
        assert!(t.margin.is_nan() && t.logit_margin.is_nan(), "{t:?}");
        let sigmoid = RoutingRule {
            scoring: RouterScoring::Sigmoid,
            ..SOFTMAX
        };
        // a NaN that is neither chosen nor the runner-up leaves a sigmoid router's margin
        let t = token(&sigmoid, &[2.0, 1.0, 0.5, f32::NAN], &[0, 1]);
        assert_eq!((t.runner_up, t.logit_margin), (Some(2), 0.25));
        let t = token(&sigmoid, &[2.0, f32::NAN, 0.5, -1.0], &[0, 1]);
        assert!(t.margin.is_nan() && t.logit_margin.is_nan(), "{t:?}");
    }

    #[test]
    fn choosing_every_expert_leaves_nothing_to_change() {
        let t = token(&SOFTMAX, &[0.1, 0.2, 0.3], &[2, 1, 0]);
        assert_eq!(t.runner_up, None);
        assert_eq!((t.margin, t.logit_margin), (f32::INFINITY, f32::INFINITY));
        assert_eq!(t.logits, [0.3, 0.2, 0.1]);
    }

    #[test]
    fn sigmoid_with_bias_chooses_by_the_biased_score_and_solves_the_crossing() {
        let logits = [1.0, 0.8, 0.6, -2.0];
        let bias = [0.0, -0.3, 0.2, 0.0];
        let rule = RoutingRule {
            scoring: RouterScoring::Sigmoid,
            bias: Some(&bias),
            groups: None,
        };
        // biased scores: 0.731, 0.390, 0.846, 0.119: the top-2 are 2 and 0, expert 1 runs up
        let t = token(&rule, &logits, &[2, 0]);
        let s = |l: f32, b: f32| sigmoid(f64::from(l)) + f64::from(b);
        assert_eq!(t.runner_up, Some(1));
        assert_eq!(t.margin, (s(1.0, 0.0) - s(0.8, -0.3)) as f32);
        let delta = f64::from(t.logit_margin);
        let gap = s((1.0 - delta) as f32, 0.0) - s((0.8 + delta) as f32, -0.3);
        assert!(gap.abs() < 1e-6, "{gap} at {delta}");
        // wider than the gap without the bias: the bias favours the chosen expert
        assert!(t.logit_margin > 0.1, "{t:?}");
        let unbiased = RoutingRule { bias: None, ..rule };
        let t = token(&unbiased, &logits, &[0, 1]);
        assert_eq!((t.runner_up, t.logit_margin), (Some(2), half_gap(0.8, 0.6)));
    }

    #[test]
    fn softmax_with_bias_crosses_at_the_logit_margin_and_not_before() {
        let logits = [1.5, 0.9, 0.7, 0.2, -0.4];
        let bias = [0.0, 0.0, 0.03, 0.0, 0.0];
        let rule = RoutingRule {
            bias: Some(&bias),
            ..SOFTMAX
        };
        let t = token(&rule, &logits, &[0, 1]);
        assert_eq!(t.runner_up, Some(2));
        assert!(t.margin > 0.0 && t.logit_margin > 0.0, "{t:?}");
        let margin_at = |delta: f32| {
            [delta, -delta]
                .map(|others| {
                    let moved = shifted(&logits, &[1], &[2], delta, others);
                    token(&rule, &moved, &[0, 1]).margin
                })
                .into_iter()
                .fold(f32::INFINITY, f32::min)
        };
        assert!(margin_at(t.logit_margin * 0.999) > 0.0);
        assert!(margin_at(t.logit_margin * 1.001) < 0.0);
    }

    /// 8 experts in 4 groups of 2; 2 experts chosen.
    const GROUPED_LOGITS: [f32; 8] = [2.0, 1.5, 0.5, -2.0, 1.8, -0.5, 2.6, -1.0];
    /// A bias of zeros: the numeric path, with the scores of no bias.
    const ZERO_BIAS: [f32; 8] = [0.0; 8];

    /// Sigmoid scores, 4 groups of 2, `top_groups` of them chosen.
    fn grouped(top_groups: usize) -> RoutingRule<'static> {
        RoutingRule {
            scoring: RouterScoring::Sigmoid,
            bias: Some(&ZERO_BIAS),
            groups: Some(ExpertGroups {
                groups: 4,
                top_groups,
            }),
        }
    }

    #[test]
    fn grouped_top_k_finds_the_runner_up_in_the_chosen_groups_only() {
        let (logits, rule) = (GROUPED_LOGITS, grouped(2));
        let s = |e: usize| sigmoid(f64::from(logits[e]));
        // group scores: g0 = s0 + s1, g1 = s2 + s3, g2 = s4 + s5, g3 = s6 + s7; g0 and g2 win
        let group = [s(0) + s(1), s(2) + s(3), s(4) + s(5), s(6) + s(7)];
        assert!(group[0] > group[2] && group[2] > group[3] && group[3] > group[1]);
        let t = token(&rule, &logits, &[0, 4]);
        // expert 6 has the best score of all but its group was not chosen
        assert_eq!(t.runner_up, Some(1));
        assert_eq!(t.margin, (s(4) - s(1)) as f32);
        assert_eq!(t.group_margin, Some((group[2] - group[3]) as f32));
        // the group pair is the closer one here: moving g2 down and g3 up crosses first
        let group_gap = |delta: f64| {
            let moved = |e: usize, by: f64| sigmoid(f64::from(logits[e]) + by);
            moved(4, -delta) + moved(5, -delta) - moved(6, delta) - moved(7, delta)
        };
        let delta = f64::from(t.logit_margin);
        assert!(group_gap(delta).abs() < 1e-6, "{t:?}");
        assert!(delta < 0.1, "{t:?}");
    }

    #[test]
    fn a_chosen_expert_outside_the_best_groups_gives_a_negative_group_margin() {
        let (logits, rule) = (GROUPED_LOGITS, grouped(2));
        // experts 0 and 2: groups 0 and 1, where the router should have chosen 0 and 2
        let t = token(&rule, &logits, &[0, 2]);
        assert!(t.group_margin.unwrap() < 0.0, "{t:?}");
        assert_eq!(t.logit_margin, 0.0);
        // every group chosen: no group margin, the expert pair alone
        let t = token(&grouped(4), &logits, &[6, 0]);
        assert_eq!((t.group_margin, t.runner_up), (None, Some(4)));
        assert!((t.logit_margin - 0.1).abs() < 1e-6, "{t:?}");
    }

    #[test]
    fn grouped_softmax_crosses_at_the_logit_margin() {
        let logits = [2.0, 1.0, 0.3, 0.2, 1.6, 1.4, 0.1, 0.0];
        let rule = RoutingRule {
            groups: Some(ExpertGroups {
                groups: 4,
                top_groups: 2,
            }),
            ..SOFTMAX
        };
        let t = token(&rule, &logits, &[0, 4]);
        assert_eq!(t.runner_up, Some(5));
        assert!(t.group_margin.unwrap() > 0.0);
        // the expert pair (1.6 vs 1.4) is 0.1; the group pair (g2 vs g1) is further
        assert_eq!(t.logit_margin, half_gap(1.6, 1.4));
    }

    #[test]
    fn load_counts_each_choice() {
        assert_eq!(expert_load(4, &[0, 1, 1, 3, 0, 1]), [2, 3, 0, 1]);
    }

    #[test]
    fn rules_that_cannot_route_say_why() {
        let bias = [0.0; 3];
        let rule = RoutingRule {
            bias: Some(&bias),
            ..SOFTMAX
        };
        assert!(rule.check(3).is_ok());
        let error = rule.check(4).unwrap_err();
        assert!(error.contains("3 values for 4 experts"), "{error}");
        let groups = |groups, top_groups| RoutingRule {
            groups: Some(ExpertGroups { groups, top_groups }),
            ..SOFTMAX
        };
        assert!(groups(4, 2).check(8).is_ok());
        assert!(groups(3, 1).check(8).unwrap_err().contains("do not split"));
        assert!(groups(0, 0).check(8).is_err());
        assert!(groups(4, 5).check(8).unwrap_err().contains("1 to 4"));
    }
}
