//! Comparing two captured tensors value by value.

use super::{rtol_needed, Check, ErrorMeasure, ErrorStat, Pair};

/// The decisive check and the exact error measures of the pair's captured values `a` (the
/// reference's) and `b`, or `None` when their lengths differ (then a warning says so).
pub(super) fn compare(
    a: &[f32],
    b: &[f32],
    pair: &Pair<'_>,
    warnings: &mut Vec<String>,
) -> Option<(Check, ErrorMeasure)> {
    if a.len() != b.len() {
        warnings.push(format!(
            "captured tensors of {} and {} values for one record; compared by summaries instead",
            a.len(),
            b.len()
        ));
        return None;
    }
    Some(measure(
        a,
        b,
        pair.tolerance.atol,
        pair.tolerance.rtol,
        pair.error_stat,
    ))
}

/// Each element's error against its allowance `atol + rtol·|a_i|`, the statistic `stat` of
/// those ratios, and the exact error measures. Elements that are NaN on both sides, or the same
/// infinity, agree.
pub(crate) fn measure(
    a: &[f32],
    b: &[f32],
    atol: f64,
    rtol: f64,
    stat: ErrorStat,
) -> (Check, ErrorMeasure) {
    let mut ratios = Vec::with_capacity(a.len());
    let (mut diff_sq, mut a_sq, mut b_sq, mut dot, mut sum_a) =
        (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    let mut finite = 0usize;
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ratios.push(ratio(x, y, atol, rtol));
        let d = (y - x).abs();
        if x.is_finite() && y.is_finite() {
            finite += 1;
            diff_sq += d * d;
            a_sq += x * x;
            b_sq += y * y;
            dot += x * y;
            sum_a += x;
            max_abs = max_abs.max(d);
            if x != 0.0 {
                max_rel = max_rel.max(d / x.abs());
            }
        }
    }
    let mismatched = ratios.iter().filter(|&&r| r > 1.0).count();
    let decisive = match stat {
        ErrorStat::Elementwise => ratios.iter().copied().fold(0.0, f64::max),
        #[allow(clippy::cast_precision_loss)]
        ErrorStat::Mean => ratios.iter().sum::<f64>() / ratios.len().max(1) as f64,
        ErrorStat::Median => quantile(&mut ratios, 0.5),
        ErrorStat::Quantile(q) => quantile(&mut ratios, q),
        #[allow(clippy::cast_precision_loss)]
        ErrorStat::Norm => {
            let allowed = (a.len() as f64).sqrt() * atol + rtol * a_sq.sqrt();
            if diff_sq == 0.0 {
                0.0
            } else if allowed > 0.0 {
                diff_sq.sqrt() / allowed
            } else {
                f64::INFINITY
            }
        }
    };
    #[allow(clippy::cast_precision_loss)]
    let n = finite.max(1) as f64;
    let variance = a_sq / n - (sum_a / n).powi(2);
    let measure = ErrorMeasure {
        relative_error: (a_sq > 0.0).then(|| (diff_sq / a_sq).sqrt()),
        exact: true,
        max_abs_error: Some(max_abs),
        max_rel_error: Some(max_rel),
        cosine: (a_sq > 0.0 && b_sq > 0.0).then(|| dot / (a_sq.sqrt() * b_sq.sqrt())),
        nmse_db: (variance > 0.0).then(|| 10.0 * (diff_sq / n / variance).log10()),
        mismatched: Some((mismatched, ratios.len())),
    };
    let check = Check {
        what: format!("elements ({stat})"),
        reference: 0.0,
        other: 0.0,
        difference: decisive,
        allowed: 1.0,
    };
    (check, measure)
}

/// Whether two elements agree whatever the tolerance: both NaN, or the same infinity.
fn agree(x: f64, y: f64) -> bool {
    (x.is_nan() && y.is_nan()) || (x.is_infinite() && x == y)
}

/// `|y − x|` over its allowance `atol + rtol·|x|`: 0 where they agree or are equal, infinite
/// where the difference is NaN or nothing is allowed.
fn ratio(x: f64, y: f64, atol: f64, rtol: f64) -> f64 {
    if agree(x, y) {
        return 0.0;
    }
    let d = (y - x).abs();
    let allowed = atol + rtol * x.abs();
    if d.is_nan() {
        f64::INFINITY
    } else if d == 0.0 {
        0.0
    } else if allowed > 0.0 {
        d / allowed
    } else {
        f64::INFINITY
    }
}

/// The smallest `rtol` at which [`ratio`] is at most 1 (infinite where none is).
fn element_rtol(x: f64, y: f64, atol: f64) -> f64 {
    if agree(x, y) {
        return 0.0;
    }
    rtol_needed((y - x).abs(), atol, x.abs()).unwrap_or(f64::INFINITY)
}

/// The smallest `rtol` at which [`measure`] finds `a` and `b` close under `stat` with `atol`
/// (`None`: no `rtol` is enough). An element is within `atol + rtol·|a_i|` exactly from
/// `rtol = s_i = (|b_i − a_i| − atol) / |a_i|` on, so the largest `s_i` is the answer for
/// `elementwise` and their quantile (the same one) for `median` and `quantile`; `norm` needs
/// `(‖b − a‖ − √n·atol) / ‖a‖`; the mean of the ratios falls as `rtol` grows, and is bisected.
pub(crate) fn least_rtol(a: &[f32], b: &[f32], atol: f64, stat: ErrorStat) -> Option<f64> {
    let pairs = || a.iter().zip(b).map(|(&x, &y)| (f64::from(x), f64::from(y)));
    let needs = || pairs().map(|(x, y)| element_rtol(x, y, atol));
    let least = match stat {
        ErrorStat::Elementwise => needs().fold(0.0, f64::max),
        ErrorStat::Median => quantile(&mut needs().collect::<Vec<_>>(), 0.5),
        ErrorStat::Quantile(q) => quantile(&mut needs().collect::<Vec<_>>(), q),
        ErrorStat::Norm => {
            let (mut diff_sq, mut a_sq) = (0.0f64, 0.0f64);
            for (x, y) in pairs().filter(|(x, y)| x.is_finite() && y.is_finite()) {
                diff_sq += (y - x) * (y - x);
                a_sq += x * x;
            }
            #[allow(clippy::cast_precision_loss)]
            let fixed = (a.len() as f64).sqrt() * atol;
            rtol_needed(diff_sq.sqrt(), fixed, a_sq.sqrt()).unwrap_or(f64::INFINITY)
        }
        ErrorStat::Mean => {
            #[allow(clippy::cast_precision_loss)]
            let n = a.len().max(1) as f64;
            let mean = |rtol: f64| pairs().map(|(x, y)| ratio(x, y, atol, rtol)).sum::<f64>() / n;
            let most = needs().filter(|s| s.is_finite()).fold(0.0, f64::max);
            least_passing(mean, most)
        }
    };
    least.is_finite().then_some(least)
}

/// The smallest `rtol ≥ 0` at which the falling `mean` is at most 1, searched from `start`
/// upwards and then bisected; infinite when no finite `rtol` is enough.
fn least_passing(mean: impl Fn(f64) -> f64, start: f64) -> f64 {
    if mean(0.0) <= 1.0 {
        return 0.0;
    }
    let (mut low, mut high) = (0.0, start.max(f64::MIN_POSITIVE));
    while mean(high) > 1.0 {
        low = high;
        high *= 2.0;
        if !high.is_finite() {
            return f64::INFINITY;
        }
    }
    // To the last bit, or as near as 200 halvings get.
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        if middle <= low || middle >= high {
            break;
        }
        if mean(middle) <= 1.0 {
            high = middle;
        } else {
            low = middle;
        }
    }
    high
}

fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((values.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    values[at]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_measures_and_statistics() {
        let a = [1.0, 2.0, -4.0, f32::NAN, 0.0];
        let b = [1.0, 2.002, -4.0, f32::NAN, 0.5];
        let (check, measured) = measure(&a, &b, 0.01, 0.0, ErrorStat::Elementwise);
        assert!((check.difference - 50.0).abs() < 1e-9, "{check:?}");
        assert_eq!(measured.mismatched, Some((1, 5)));
        assert!((measured.max_abs_error.unwrap() - 0.5).abs() < 1e-9);
        let (median, _) = measure(&a, &b, 0.01, 0.0, ErrorStat::Median);
        assert_eq!(median.difference, 0.0);
        let (mean, _) = measure(&a, &b, 1.0, 0.0, ErrorStat::Mean);
        assert!(mean.difference < 1.0);
        let (same, exact) = measure(&a, &a, 0.0, 0.0, ErrorStat::Elementwise);
        assert_eq!((same.difference, exact.relative_error), (0.0, Some(0.0)));
        assert_eq!(exact.nmse_db, Some(f64::NEG_INFINITY));
    }

    #[test]
    fn the_least_rtol_is_where_each_statistic_starts_to_pass() {
        let a: Vec<f32> = (0..200).map(|i| (i as f32 * 0.31).sin() + 1.5).collect();
        let b: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &x)| x * (1.0 + 1e-3 * ((i % 7) as f32 - 3.0)))
            .collect();
        let atol = 1e-6;
        let stats = [
            ErrorStat::Elementwise,
            ErrorStat::Mean,
            ErrorStat::Median,
            ErrorStat::Quantile(0.9),
            ErrorStat::Norm,
        ];
        for stat in stats {
            let least = least_rtol(&a, &b, atol, stat).expect("a finite rtol");
            assert!(least > 0.0, "{stat}");
            let at = |rtol| measure(&a, &b, atol, rtol, stat).0.ratio();
            assert!(at(least) <= 1.0, "{stat}: {least} does not pass");
            assert!(
                at(least * (1.0 - 1e-9)) > 1.0,
                "{stat}: {least} is not the least"
            );
        }
        // Within atol alone: no rtol needed; a NaN against a number: no rtol enough.
        assert_eq!(least_rtol(&a, &a, 0.0, ErrorStat::Elementwise), Some(0.0));
        let mut nan = b.clone();
        nan[3] = f32::NAN;
        assert_eq!(least_rtol(&a, &nan, atol, ErrorStat::Elementwise), None);
        assert!(least_rtol(&a, &nan, atol, ErrorStat::Median).is_some());
    }
}
