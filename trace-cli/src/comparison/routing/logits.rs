//! One layer's router logits judged as a stage is: the logits both runs list of each token
//! (its chosen experts' and runner-up's, where the other lists the same expert) under the
//! tolerance `diff` gives the pair of traces' stages (`layer.N.router_logits` for overrides),
//! and whether the router's input, the layer's `mlp_in`, was within it: logits beyond it from an
//! input within it say the router's own computation differs (its gate weights, its precision).

use serde::Serialize;
use trace_runtime::compare::{ErrorStat, Tolerance, Tolerances};

/// The router logits of two runs compared so far, in one layer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogitErrors {
    /// Logits compared.
    count: usize,
    /// Σ (other − reference)².
    error_squares: f64,
    /// Σ reference².
    reference_squares: f64,
    /// The largest `|other − reference| / (atol + rtol·|reference|)`.
    worst_element: f64,
    /// A logit was NaN on either side.
    nan: bool,
}

impl LogitErrors {
    /// Folds in one logit of each run (for two softmax routers, each less its side's mean over
    /// the token's common experts: see `token::common_logits`), `tolerance` the layer's.
    /// `recorded` is the reference's logit as recorded: the scale of `rtol` and of the
    /// reference's RMS.
    pub(crate) fn add(&mut self, reference: f64, other: f64, recorded: f64, tolerance: Tolerance) {
        let d = (other - reference).abs();
        if d.is_nan() {
            self.nan = true;
            return;
        }
        self.count += 1;
        self.error_squares += d * d;
        self.reference_squares += recorded * recorded;
        self.worst_element = self
            .worst_element
            .max(ratio(d, tolerance.atol + tolerance.rtol * recorded.abs()));
    }

    fn rms(sum: f64, count: usize) -> f64 {
        if count == 0 {
            0.0
        } else {
            (sum / count as f64).sqrt()
        }
    }

    /// The RMS error over the logits compared.
    fn rms_error(&self) -> f64 {
        Self::rms(self.error_squares, self.count)
    }

    /// The error over what `criterion` and `tolerance` allow: within at most 1. The norm
    /// criterion as stages are judged by it (RMS error against `atol` plus `rtol` times the
    /// reference's RMS); every other statistic by every element (a token lists only k + 1
    /// logits, too few for a mean or a quantile to mean more), which is the strictest of them.
    fn ratio(&self, criterion: ErrorStat, tolerance: Tolerance) -> f64 {
        if self.nan {
            return f64::INFINITY;
        }
        match criterion {
            ErrorStat::Norm => ratio(
                self.rms_error(),
                tolerance.atol + tolerance.rtol * Self::rms(self.reference_squares, self.count),
            ),
            _ => self.worst_element,
        }
    }
}

/// `error / allowed`; 0 where both are 0, infinite where only `allowed` is.
fn ratio(error: f64, allowed: f64) -> f64 {
    if error == 0.0 {
        0.0
    } else if allowed > 0.0 {
        error / allowed
    } else {
        f64::INFINITY
    }
}

/// How many times its input's ratio (error over what the tolerance allows) the router logits'
/// ratio must be for their error to be the router's own, not its input's carried through: a
/// router is a linear map, which carries its input's relative error on amplified by a small
/// factor. Measured (`diff --json`, `router_logits.ratio` over `input_ratio`, on the traces of
/// `python/tests/test_moe_port.py`): a layer after a bug's, its input off, at most 4.2; a router
/// in bf16, its own error, at least 29 (2·10⁴ from an input within the tolerance).
pub(crate) const ROUTER_OWN_GAIN: f64 = 10.0;

/// What the layer's `mlp_in` (the router's input) was, in the passes compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RouterInput {
    /// Compared, and within the tolerance in every pass.
    Within,
    /// Diverged in some pass.
    Diverged,
    /// Not in both traces: the router's own error cannot be told from an inherited one.
    NotTraced,
}

/// One layer's router logits judged (`--json`: a layer's `router_logits`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RouterLogitsJudged {
    /// Logits compared: the chosen experts' and runner-ups' both runs list.
    pub(crate) compared: usize,
    /// RMS of the other's error on them, and of the reference's logits.
    pub(crate) rms_error: f64,
    pub(crate) rms_reference: f64,
    /// The criterion and tolerance they were judged by (the stages').
    pub(crate) criterion: ErrorStat,
    pub(crate) atol: f64,
    pub(crate) rtol: f64,
    /// The error over what the tolerance allows (`null`: infinite, a NaN logit).
    pub(crate) ratio: f64,
    /// With a floor: the floor's RMS error on the same layer's logits.
    pub(crate) floor_rms_error: Option<f64>,
    /// Within the tolerance, or with a floor within its factor times the floor's error.
    pub(crate) within: bool,
    pub(crate) input: RouterInput,
    /// `mlp_in`'s worst ratio over the passes (`null`: not traced).
    pub(crate) input_ratio: Option<f64>,
    /// Beyond, and by over [`ROUTER_OWN_GAIN`] times its input's ratio (or its input not
    /// traced): the router's own computation differs.
    pub(crate) own_error: bool,
}

impl RouterLogitsJudged {
    /// The logits of `layer` judged: `errors` the other's, `floor` the floor's with the factor
    /// the other may have of its error, `input_ratio` the layer's `mlp_in`'s worst ratio
    /// (`None`: not traced); `None` where no logit was compared.
    pub(crate) fn judge(
        layer: usize,
        errors: &LogitErrors,
        floor: Option<(&LogitErrors, f64)>,
        tolerances: &Tolerances,
        input_ratio: Option<f64>,
    ) -> Option<Self> {
        if errors.count == 0 && !errors.nan {
            return None;
        }
        let name = format!("layer.{layer}.router_logits");
        let tolerance = tolerances.for_name(&name);
        let criterion = tolerances.error_stat_for(&name);
        let ratio = errors.ratio(criterion, tolerance);
        let floor_rms_error = floor.map(|(floor, _)| floor.rms_error());
        let within_floor = floor.is_some_and(|(floor, factor)| {
            !errors.nan && errors.rms_error() <= factor * floor.rms_error()
        });
        let within = ratio <= 1.0 || within_floor;
        Some(Self {
            compared: errors.count,
            rms_error: errors.rms_error(),
            rms_reference: LogitErrors::rms(errors.reference_squares, errors.count),
            criterion,
            atol: tolerance.atol,
            rtol: tolerance.rtol,
            ratio,
            floor_rms_error,
            within,
            input: match input_ratio {
                None => RouterInput::NotTraced,
                Some(r) if r <= 1.0 => RouterInput::Within,
                Some(_) => RouterInput::Diverged,
            },
            input_ratio,
            own_error: !within && input_ratio.is_none_or(|r| ratio > ROUTER_OWN_GAIN * r),
        })
    }

    /// A token whose tolerance is per element: `layer.N.router_logits`'s.
    pub(crate) fn tolerance(tolerances: &Tolerances, layer: usize) -> Tolerance {
        tolerances.for_name(&format!("layer.{layer}.router_logits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tolerances(rtol: f64, criterion: ErrorStat) -> Tolerances {
        Tolerances {
            default: Tolerance { atol: 0.0, rtol },
            error_stat: criterion,
            ..Tolerances::default()
        }
    }

    fn errors(pairs: &[(f32, f32)], tolerance: Tolerance) -> LogitErrors {
        let mut errors = LogitErrors::default();
        for &(a, b) in pairs {
            errors.add(f64::from(a), f64::from(b), f64::from(a), tolerance);
        }
        errors
    }

    #[test]
    fn logits_beyond_the_stages_tolerance_from_an_input_within_it_are_the_routers_own() {
        let strict = tolerances(1e-4, ErrorStat::Norm);
        let bf16 = errors(&[(1.0, 1.01), (-2.0, -2.01)], strict.default);
        let judged =
            RouterLogitsJudged::judge(0, &bf16, None, &strict, Some(0.01)).expect("compared");
        assert!(!judged.within && judged.own_error, "{judged:?}");
        // Its ratio (63) within ROUTER_OWN_GAIN times its input's: the input's error carried on.
        let inherited = RouterLogitsJudged::judge(0, &bf16, None, &strict, Some(7.0)).unwrap();
        assert!(!inherited.own_error && inherited.input == RouterInput::Diverged);
        let amplified = RouterLogitsJudged::judge(0, &bf16, None, &strict, Some(5.0)).unwrap();
        assert!(amplified.own_error, "{amplified:?}");
        // A quantized pair's looser tolerance: within.
        let loose = tolerances(0.15, ErrorStat::Norm);
        let judged =
            RouterLogitsJudged::judge(0, &bf16, None, &loose, Some(0.01)).expect("compared");
        assert!(judged.within && !judged.own_error, "{judged:?}");
        // A floor with as much error excuses it.
        let judged =
            RouterLogitsJudged::judge(0, &bf16, Some((&bf16, 1.0)), &strict, Some(0.01)).unwrap();
        assert!(judged.within);
    }

    #[test]
    fn elementwise_judges_every_logit_and_a_nan_is_beyond() {
        let strict = tolerances(1e-2, ErrorStat::Elementwise);
        let one_off = errors(&[(1.0, 1.0), (1.0, 1.0), (0.1, 0.102)], strict.default);
        assert!(one_off.ratio(ErrorStat::Elementwise, strict.default) > 1.0);
        assert!(one_off.ratio(ErrorStat::Norm, strict.default) < 1.0);
        let nan = errors(&[(1.0, f32::NAN)], strict.default);
        let judged = RouterLogitsJudged::judge(0, &nan, None, &strict, None).unwrap();
        assert!(!judged.within && judged.own_error);
    }
}
