//! One token's routing in two runs: whether they chose the same experts, the other's error on
//! the router logits, and whether that error explains a different choice (a near-tie) or a
//! difference in the weights.

use serde::Serialize;
use trace_runtime::RoutedToken;

/// A weight may differ by this fraction of the token's largest weight whatever the logit error:
/// f32 rounding of the softmax or sigmoid and of the normalization, with room to spare.
const WEIGHT_FLOOR: f64 = 1e-5;

/// What a differing choice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RoutingVerdict {
    /// The reference's `logit_margin` is within the other's router-logit error: moving the
    /// logits by that error can change the choice, as rounding does.
    NearTie,
    /// The reference chose by more than the other's logit error (or an error or margin is NaN).
    Divergence,
}

impl RoutingVerdict {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::NearTie => "near-tie",
            Self::Divergence => "divergence",
        }
    }
}

/// The router logits a token lists (its chosen experts', then its runner-up's), by expert.
fn listed_logits(token: &RoutedToken) -> impl Iterator<Item = (u32, f32)> + '_ {
    let experts = token.experts.iter().copied().chain(token.runner_up);
    experts.zip(token.logits.iter().copied())
}

/// The logits both tokens list of the same expert: `(reference's, other's)`. With `shift_free`
/// (both routers softmax, whose choice, margins and weights depend only on the gaps between
/// logits), each side's less its own mean over those experts, so that a side recording
/// log-probabilities or max-subtracted logits is the same router; there fewer than 2 in common
/// measure nothing (no gap), and none is returned.
pub(crate) fn common_logits(
    reference: &RoutedToken,
    other: &RoutedToken,
    shift_free: bool,
) -> Vec<(f64, f64)> {
    shifted_common_logits(reference, other, shift_free)
        .into_iter()
        .map(|(ours, theirs, _)| (ours, theirs))
        .collect()
}

/// [`common_logits`], each with the reference's logit as recorded (the scale of a relative
/// tolerance): `(reference's, other's, reference's as recorded)`.
pub(crate) fn shifted_common_logits(
    reference: &RoutedToken,
    other: &RoutedToken,
    shift_free: bool,
) -> Vec<(f64, f64, f64)> {
    let common: Vec<(f64, f64)> = listed_logits(other)
        .filter_map(|(expert, theirs)| {
            let (_, ours) = listed_logits(reference).find(|&(e, _)| e == expert)?;
            Some((f64::from(ours), f64::from(theirs)))
        })
        .collect();
    if !shift_free {
        return common.into_iter().map(|(a, b)| (a, b, a)).collect();
    }
    if common.len() < 2 {
        return Vec::new();
    }
    let n = common.len() as f64;
    let ours_mean = common.iter().map(|p| p.0).sum::<f64>() / n;
    let theirs_mean = common.iter().map(|p| p.1).sum::<f64>() / n;
    (common.into_iter())
        .map(|(ours, theirs)| (ours - ours_mean, theirs - theirs_mean, ours))
        .collect()
}

/// The other's router-logit error on a token: the largest `|other − reference|` over the
/// experts both list a logit of (`shift_free`: up to a shift, see [`common_logits`]); `None`
/// when there is nothing to measure it on. NaN when a logit is.
pub(crate) fn logit_error(
    reference: &RoutedToken,
    other: &RoutedToken,
    shift_free: bool,
) -> Option<f64> {
    let mut error: Option<f64> = None;
    for (ours, theirs) in common_logits(reference, other, shift_free) {
        let d = (theirs - ours).abs();
        error = Some(match error {
            Some(e) if e.is_nan() || e >= d => e,
            _ => d,
        });
    }
    error
}

/// Whether the two tokens chose the same set of experts (in any order).
pub(crate) fn same_experts(reference: &RoutedToken, other: &RoutedToken) -> bool {
    sorted(&reference.experts) == sorted(&other.experts)
}

fn sorted(experts: &[u32]) -> Vec<u32> {
    let mut experts = experts.to_vec();
    experts.sort_unstable();
    experts
}

/// A differing choice judged: a near-tie when the reference's `logit_margin` is at most the
/// other's logit error `error`, else a divergence (a NaN margin or error is one). An unknown
/// error (`None`: the two list no expert in common, nor does any token of the layer) is judged
/// a divergence: a rounding error flips the closest choice, it does not replace every expert
/// the reference lists (its chosen ones and its runner-up), which only logits off by half the
/// gap between the reference's best expert and an unlisted one can do.
pub(crate) fn judge(reference: &RoutedToken, error: Option<f64>) -> RoutingVerdict {
    match error {
        Some(error) if f64::from(reference.logit_margin) <= error => RoutingVerdict::NearTie,
        _ => RoutingVerdict::Divergence,
    }
}

/// A chosen expert's weight in the two runs, past what the logit error explains.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WeightDifference {
    pub(crate) expert: u32,
    pub(crate) reference: f32,
    pub(crate) other: f32,
    /// The difference the logit error allows this weight.
    pub(crate) allowed: f64,
}

impl WeightDifference {
    /// The difference over what is allowed (infinite where a weight is NaN).
    pub(crate) fn ratio(&self) -> f64 {
        let d = (f64::from(self.other) - f64::from(self.reference)).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d / self.allowed
        }
    }
}

/// The weight of two tokens that chose the same experts that differs most past what the
/// other's logit error `error` explains; `None` when every weight is within it.
///
/// The bound: perturbing every logit by at most ε moves a softmax weight `w_i = e^{l_i}/Σ e^{l_j}`
/// by a factor within `e^{±2ε}` (its numerator by `e^{±ε}`, the sum by as much), so `|Δw_i| ≤
/// (e^{2ε} − 1)·w_i`, about `2ε·w_i`; renormalizing the chosen weights (top-k softmax, or
/// `norm_topk_prob`) is another such ratio of sums, within the same factor. A sigmoid weight
/// moves by at most `σ(1 − σ)·ε ≤ ε·w_i`, and normalized over the chosen ones by at most about
/// `2ε·w_i`. A constant scale (`routed_scaling_factor`) is the same on both sides. ε is measured
/// only on the logits the tokens list (the chosen experts and the runner-up): the others also
/// feed a full softmax's sum, so the bound is doubled, `2(e^{2ε} − 1)·|w_i|` (`4ε·|w_i|` for
/// small ε), plus [`WEIGHT_FLOOR`] of the largest weight for the rounding of the weights
/// themselves. Weights stored in a 16-bit float on one side round by more (2⁻⁸ relative for
/// bf16); such a run shows `weights` differences until it records its weights in f32.
pub(crate) fn weights_past_error(
    reference: &RoutedToken,
    other: &RoutedToken,
    error: f64,
) -> Option<WeightDifference> {
    let largest = (reference.weights.iter())
        .map(|w| f64::from(w.abs()))
        .fold(0.0, f64::max);
    let mut worst: Option<WeightDifference> = None;
    for (at, &expert) in reference.experts.iter().enumerate() {
        let Some(ours) = reference.weights.get(at).copied() else {
            continue;
        };
        let Some(theirs) = (other.experts.iter().position(|&e| e == expert))
            .and_then(|at| other.weights.get(at).copied())
        else {
            continue;
        };
        let allowed = 2.0 * (2.0 * error).exp_m1() * f64::from(ours.abs()) + WEIGHT_FLOOR * largest;
        let difference = WeightDifference {
            expert,
            reference: ours,
            other: theirs,
            allowed,
        };
        let ratio = difference.ratio();
        if ratio > 1.0 && worst.as_ref().is_none_or(|w| ratio > w.ratio()) {
            worst = Some(difference);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(experts: &[u32], weights: &[f32], runner_up: u32, logits: &[f32]) -> RoutedToken {
        RoutedToken {
            row: 0,
            experts: experts.to_vec(),
            weights: weights.to_vec(),
            runner_up: Some(runner_up),
            margin: 0.1,
            group_margin: None,
            logit_margin: 0.05,
            logits: logits.to_vec(),
        }
    }

    #[test]
    fn the_error_is_over_the_experts_both_list() {
        let ours = token(&[1, 2], &[0.6, 0.4], 3, &[2.0, 1.0, 0.9]);
        let theirs = token(&[2, 1], &[0.4, 0.6], 4, &[1.1, 2.05, 0.0]);
        // experts 1 and 2 in both; 3 and 4 each in one list only
        let error = logit_error(&ours, &theirs, false).expect("shared experts");
        assert!((error - 0.1).abs() < 1e-6, "{error}");
        assert!(same_experts(&ours, &theirs));
        let apart = token(&[5, 6], &[0.5, 0.5], 7, &[1.0, 1.0, 0.0]);
        assert_eq!(logit_error(&ours, &apart, false), None);
        // Softmax on both sides: a per-token shift is no error; one common expert measures none.
        let shifted = token(&[1, 2], &[0.6, 0.4], 3, &[-1.0, -2.0, -2.1]);
        assert!(logit_error(&ours, &shifted, true).expect("common") < 1e-6);
        assert!((logit_error(&ours, &shifted, false).unwrap() - 3.0).abs() < 1e-9);
        let one = token(&[1, 5], &[0.6, 0.4], 6, &[-1.0, 0.0, 0.0]);
        assert_eq!(logit_error(&ours, &one, true), None);
    }

    #[test]
    fn a_nan_logit_makes_the_error_nan_and_the_verdict_a_divergence() {
        let ours = token(&[1, 2], &[0.6, 0.4], 3, &[2.0, 1.0, 0.9]);
        let theirs = token(&[1, 3], &[0.6, 0.4], 2, &[f32::NAN, 1.0, 0.9]);
        let error = logit_error(&ours, &theirs, false).expect("shared experts");
        assert!(error.is_nan());
        assert_eq!(judge(&ours, Some(error)), RoutingVerdict::Divergence);
        assert_eq!(judge(&ours, None), RoutingVerdict::Divergence);
        assert_eq!(
            judge(&ours, Some(f64::from(0.05f32))),
            RoutingVerdict::NearTie
        );
        assert_eq!(judge(&ours, Some(0.049)), RoutingVerdict::Divergence);
    }

    #[test]
    fn weights_within_the_logit_error_pass_and_beyond_it_do_not() {
        let ours = token(&[1, 2], &[0.6, 0.4], 3, &[2.0, 1.0, 0.9]);
        // 0.6 → 0.604: allowed 2·(e^{0.02} − 1)·0.6 + 6e-6 ≈ 0.0242 at ε = 0.01
        let close = token(&[1, 2], &[0.604, 0.396], 3, &[2.01, 1.0, 0.9]);
        assert!(weights_past_error(&ours, &close, 0.01).is_none());
        let far = token(&[2, 1], &[0.5, 0.5], 3, &[1.0, 2.0, 0.9]);
        let worst = weights_past_error(&ours, &far, 0.0).expect("past the error");
        assert_eq!(worst.expert, 1);
        assert!(worst.ratio() > 1.0);
    }
}
