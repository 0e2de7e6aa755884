//! Comparing two tensors through their summaries: every recorded quantity against the largest
//! difference it can have when every element is within `atol + rtol·|a_i|` of the reference.
//!
//! With `n` elements, `‖a‖` the reference's L2 norm and `M` its largest magnitude:
//! min and max move by at most `atol + rtol·M`; the mean and the (population) std by at most
//! `atol + rtol·‖a‖/√n`; the L2 norm by at most `√n·atol + rtol·‖a‖`; each sketch component by
//! at most `n·atol + rtol·√n·‖a‖`; a sample value `a_i` by at most `atol + rtol·|a_i|`. NaN and
//! infinity counts must be equal. Rounded statistics (`stats_precision`) widen their bounds by
//! that fraction of the values.
//!
//! Under the `norm` criterion (`‖b − a‖ ≤ τ = √n·atol + rtol·‖a‖`) the mean and std move by at
//! most `τ/√n`, the L2 norm, min, max and each sample by at most `τ`, each sketch component by
//! at most `√n·τ` (Cauchy–Schwarz): the same bounds for the mean, std, norm and sketch, looser
//! ones for single values.

use super::{rtol_needed, Check, ErrorMeasure, ErrorStat, Tolerance};
use crate::summary::{Sketch, TensorSummary};

/// Every check the two summaries allow.
pub(super) fn checks(
    a: &TensorSummary,
    b: &TensorSummary,
    tol: Tolerance,
    stat: ErrorStat,
    precision: f64,
) -> Vec<Check> {
    let (sa, sb) = (&a.stats, &b.stats);
    #[allow(clippy::cast_precision_loss)]
    let n = sa.count as f64;
    let root_n = n.sqrt();
    let norm = f64::from(sa.l2_norm);
    let magnitude = f64::from(sa.min.abs().max(sa.max.abs()));
    let rms = if n > 0.0 { norm / root_n } else { 0.0 };
    let mut checks = Vec::new();
    let mut exact = |what: &str, x: usize, y: usize| {
        #[allow(clippy::cast_precision_loss)]
        checks.push(Check {
            what: what.to_owned(),
            reference: x as f64,
            other: y as f64,
            difference: x.abs_diff(y) as f64,
            allowed: 0.0,
        });
    };
    exact("nan_count", sa.nan_count, sb.nan_count);
    exact("inf_count", sa.inf_count, sb.inf_count);
    let mut within = |what: &str, x: f32, y: f32, allowed: f64| {
        let (x, y) = (f64::from(x), f64::from(y));
        let rounding = precision * x.abs().max(y.abs());
        checks.push(Check {
            what: what.to_owned(),
            reference: x,
            other: y,
            difference: difference(x, y),
            allowed: allowed + rounding,
        });
    };
    let norm_bound = root_n * tol.atol + tol.rtol * norm;
    let single = |value: f64| {
        if stat == ErrorStat::Norm {
            norm_bound
        } else {
            tol.atol + tol.rtol * value
        }
    };
    let extreme = single(magnitude);
    within("min", sa.min, sb.min, extreme);
    within("max", sa.max, sb.max, extreme);
    within("mean", sa.mean, sb.mean, tol.atol + tol.rtol * rms);
    within("std", sa.std, sb.std, tol.atol + tol.rtol * rms);
    within(
        "l2_norm",
        sa.l2_norm,
        sb.l2_norm,
        root_n * tol.atol + tol.rtol * norm,
    );
    if let (Some(ka), Some(kb)) = (a.sketch, b.sketch) {
        let allowed = Sketch::bound(sa.count, norm, tol.atol, tol.rtol);
        for (k, (x, y)) in ka.0.iter().zip(&kb.0).enumerate() {
            within(&format!("sketch[{k}]"), *x, *y, allowed);
        }
    }
    let samples = [("head", &a.head, &b.head, 0), ("tail", &a.tail, &b.tail, 0)];
    for (what, xs, ys, _) in samples {
        if xs.len() == ys.len() {
            for (i, (x, y)) in xs.iter().zip(ys.iter()).enumerate() {
                within(&format!("{what}[{i}]"), *x, *y, single(f64::from(x.abs())));
            }
        }
    }
    checks
}

/// The smallest `rtol` at which every check of [`checks`] passes with `atol` as given (`None`:
/// no `rtol` is enough). Each bound is `fixed + rtol·scale`, read off the checks at `rtol` 0
/// and 1.
pub(super) fn least_rtol(
    a: &TensorSummary,
    b: &TensorSummary,
    atol: f64,
    stat: ErrorStat,
    precision: f64,
) -> Option<f64> {
    let at = |rtol| checks(a, b, Tolerance { atol, rtol }, stat, precision);
    let (fixed, unit) = (at(0.0), at(1.0));
    fixed.iter().zip(&unit).try_fold(0.0, |least: f64, (f, u)| {
        let needed = rtol_needed(f.difference, f.allowed, u.allowed - f.allowed)?;
        Some(least.max(needed))
    })
}

/// `|x − y|`, with equal non-finite values (the same infinity, or NaN and NaN) at 0 and any
/// other non-finite difference infinite.
fn difference(x: f64, y: f64) -> f64 {
    if x.is_nan() && y.is_nan() || x == y {
        0.0
    } else if x.is_finite() && y.is_finite() {
        (x - y).abs()
    } else {
        f64::INFINITY
    }
}

/// The relative error estimated from the sketches (see [`ErrorMeasure::relative_error`]).
pub(super) fn estimate(a: &TensorSummary, b: &TensorSummary) -> ErrorMeasure {
    let norm = f64::from(a.stats.l2_norm);
    let relative_error = match (a.sketch, b.sketch) {
        (Some(ka), Some(kb)) if norm > 0.0 => {
            let squared: f64 =
                ka.0.iter()
                    .zip(&kb.0)
                    .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
                    .sum();
            #[allow(clippy::cast_precision_loss)]
            let dims = ka.0.len() as f64;
            Some(squared.sqrt() / (dims.sqrt() * norm))
        }
        _ => None,
    };
    ErrorMeasure {
        relative_error,
        ..ErrorMeasure::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(values: &[f32]) -> TensorSummary {
        TensorSummary::of_values(vec![values.len()], "f32", values)
    }

    fn worst(checks: &[Check]) -> f64 {
        checks.iter().map(Check::ratio).fold(0.0, f64::max)
    }

    #[test]
    fn close_tensors_pass_every_bound_even_at_the_limit() {
        let a: Vec<f32> = (0..2000)
            .map(|i| ((i * 7919 % 1000) as f32 / 100.0 - 5.0).sin() * 3.0)
            .collect();
        let tol = Tolerance {
            atol: 1e-4,
            rtol: 1e-3,
        };
        // every element moved by 99% of what it is allowed, in the worst directions
        let b: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let allowed = (tol.atol + tol.rtol * f64::from(x.abs())) as f32 * 0.99;
                let sign = if crate::summary::element_hash(i as u64) & 1 == 1 {
                    -1.0
                } else {
                    1.0
                };
                x + sign * allowed
            })
            .collect();
        let checks = checks(&summary(&a), &summary(&b), tol, ErrorStat::Elementwise, 0.0);
        assert!(
            worst(&checks) <= 1.0,
            "{:?}",
            checks.iter().max_by(|x, y| x.ratio().total_cmp(&y.ratio()))
        );
    }

    #[test]
    fn the_norm_criterion_allows_a_few_large_errors_the_elementwise_one_does_not() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.1).sin() + 2.0).collect();
        let mut b = a.clone();
        b[0] += 0.05; // one sample off by 2.5%, the whole tensor by 0.1% RMS
        let tol = Tolerance {
            atol: 0.0,
            rtol: 0.01,
        };
        let (sa, sb) = (summary(&a), summary(&b));
        assert!(worst(&checks(&sa, &sb, tol, ErrorStat::Elementwise, 0.0)) > 1.0);
        assert!(worst(&checks(&sa, &sb, tol, ErrorStat::Norm, 0.0)) <= 1.0);
    }

    #[test]
    fn a_reordering_is_caught_by_the_sketch_alone() {
        let rows: Vec<Vec<f32>> = (0..7)
            .map(|r| {
                (0..384)
                    .map(|c| ((r * 384 + c) as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        let a: Vec<f32> = rows.concat();
        let b: Vec<f32> = rows.iter().rev().flatten().copied().collect();
        let tol = Tolerance {
            atol: 1e-5,
            rtol: 1e-5,
        };
        let checks = checks(&summary(&a), &summary(&b), tol, ErrorStat::Elementwise, 0.0);
        let failing: Vec<&str> = checks
            .iter()
            .filter(|c| c.ratio() > 1.0)
            .map(|c| c.what.as_str())
            .collect();
        assert!(
            failing.iter().any(|w| w.starts_with("sketch")),
            "{failing:?}"
        );
        assert!(
            !failing
                .iter()
                .any(|w| ["mean", "std", "l2_norm", "min", "max"].contains(w)),
            "{failing:?}"
        );
        let estimate = estimate(&summary(&a), &summary(&b)).relative_error.unwrap();
        // ‖a − Pa‖/‖a‖ is about √2 for uncorrelated rows
        assert!((0.5..3.0).contains(&estimate), "{estimate}");
    }

    #[test]
    fn the_least_rtol_is_where_every_summary_check_starts_to_pass() {
        let a: Vec<f32> = (0..500).map(|i| (i as f32 * 0.23).cos() * 2.0).collect();
        let b: Vec<f32> = a.iter().map(|x| x * 1.002 + 1e-3).collect();
        let (sa, sb) = (summary(&a), summary(&b));
        for stat in [ErrorStat::Elementwise, ErrorStat::Norm] {
            let least = least_rtol(&sa, &sb, 1e-6, stat, 0.0).expect("a finite rtol");
            let at = |rtol| {
                let tol = Tolerance { atol: 1e-6, rtol };
                worst(&checks(&sa, &sb, tol, stat, 0.0))
            };
            assert!(at(least) <= 1.0, "{stat}: {least}");
            assert!(at(least * (1.0 - 1e-9)) > 1.0, "{stat}: {least}");
        }
        let nan = summary(&[1.0, f32::NAN, 3.0]);
        let numbers = summary(&[1.0, 2.0, 3.0]);
        let stat = ErrorStat::Elementwise;
        assert_eq!(least_rtol(&nan, &numbers, 1.0, stat, 0.0), None);
    }

    #[test]
    fn nan_counts_must_agree_and_equal_nans_do_not_differ() {
        let a = summary(&[1.0, f32::NAN, 3.0]);
        let b = summary(&[1.0, 2.0, 3.0]);
        let tol = Tolerance {
            atol: 1.0,
            rtol: 1.0,
        };
        let elementwise = ErrorStat::Elementwise;
        assert!(worst(&checks(&a, &b, tol, elementwise, 0.0)).is_infinite());
        assert!(worst(&checks(&a, &a.clone(), tol, elementwise, 0.0)) == 0.0);
    }
}
