//! `TensorStats` against a naive `f64` computation, for every kernel this CPU runs, and `merge`
//! against the statistics of the whole.

use proptest::prelude::*;
use trace_runtime::{FiniteMoments, StatsKernel, TensorStats};

/// Statistics computed the obvious way, in `f64`, two passes.
#[derive(Debug)]
struct Reference {
    count: usize,
    nan: usize,
    inf: usize,
    finite: usize,
    min: f64,
    max: f64,
    mean: f64,
    std: f64,
    l2: f64,
}

impl Reference {
    fn of(data: &[f32]) -> Self {
        let finite: Vec<f64> = data
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| f64::from(x))
            .collect();
        let n = finite.len() as f64;
        let mean = finite.iter().sum::<f64>() / n;
        let var = finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Reference {
            count: data.len(),
            nan: data.iter().filter(|x| x.is_nan()).count(),
            inf: data.iter().filter(|x| x.is_infinite()).count(),
            finite: finite.len(),
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean,
            std: var.sqrt(),
            l2: finite.iter().map(|x| x * x).sum::<f64>().sqrt(),
        }
    }
}

/// Relative error of `got` against `want` beyond the rounding of `want` to `f32` (which no `f32`
/// result can avoid, and which is coarser than 1e-7 in `f32`'s subnormal range), with `scale`
/// as the smallest denominator.
#[allow(clippy::cast_possible_truncation)]
fn rel(got: f32, want: f64, scale: f64) -> f64 {
    let unavoidable = (f64::from(want as f32) - want).abs();
    let error = ((f64::from(got) - want).abs() - unavoidable).max(0.0);
    error / want.abs().max(scale).max(f64::MIN_POSITIVE)
}

/// Checks the documented guarantees; `mean_is_large` when |mean| is not small compared to the
/// spread, which is when a relative bound on the mean makes sense.
fn check(stats: &TensorStats, data: &[f32], mean_is_large: bool) -> Result<(), TestCaseError> {
    let want = Reference::of(data);
    prop_assert_eq!(stats.count, want.count);
    prop_assert_eq!(stats.nan_count, want.nan);
    prop_assert_eq!(stats.inf_count, want.inf);
    prop_assert_eq!(stats.finite_count(), want.finite);
    if want.finite == 0 {
        prop_assert_eq!(
            (stats.min, stats.max, stats.mean, stats.std, stats.l2_norm),
            (0.0, 0.0, 0.0, 0.0, 0.0)
        );
        return Ok(());
    }
    prop_assert_eq!(f64::from(stats.min), want.min);
    prop_assert_eq!(f64::from(stats.max), want.max);
    let mean_scale = if mean_is_large { 0.0 } else { want.std };
    prop_assert!(
        rel(stats.mean, want.mean, mean_scale) <= 1e-6,
        "mean {} vs {:?}",
        stats.mean,
        want
    );
    prop_assert!(
        rel(stats.std, want.std, 0.0) <= 1e-5,
        "std {} vs {:?}",
        stats.std,
        want
    );
    if want.l2 > f64::from(f32::MAX) * (1.0 + 1e-6) {
        // Documented: the norm of values near f32::MAX overflows f32 to +Inf.
        prop_assert_eq!(stats.l2_norm, f32::INFINITY);
    } else if want.l2 < f64::from(f32::MAX) * (1.0 - 1e-6) {
        prop_assert!(
            rel(stats.l2_norm, want.l2, 0.0) <= 1e-6,
            "l2_norm {} vs {:?}",
            stats.l2_norm,
            want
        );
    }
    Ok(())
}

/// Statistics from every kernel this CPU runs (the portable one always), the dispatched one
/// first.
fn all_kernels(data: &[f32]) -> Vec<(String, TensorStats)> {
    let mut out = vec![
        ("dispatched".to_string(), TensorStats::from_slice(data)),
        (
            "portable".to_string(),
            TensorStats::from_slice_portable(data),
        ),
    ];
    for kernel in StatsKernel::ALL {
        if kernel == StatsKernel::Portable {
            continue;
        }
        if let Some(stats) = TensorStats::from_slice_with(data, kernel) {
            out.push((format!("{kernel:?}"), stats));
        }
    }
    out
}

fn check_all_kernels(data: &[f32], mean_is_large: bool) -> Result<(), TestCaseError> {
    for (kernel, stats) in all_kernels(data) {
        check(&stats, data, mean_is_large)
            .map_err(|e| TestCaseError::fail(format!("{kernel} kernel: {e}")))?;
    }
    Ok(())
}

/// Roughly normal values (sum of three uniforms) with a mean `offset` and a spread `scale`.
fn normalish(max_len: usize) -> impl Strategy<Value = (Vec<f32>, f32, f32)> {
    let scale = prop_oneof![Just(1.0f32), 1e-3f32..1e3, 1e-20f32..1e-10, 1e10f32..1e20];
    (0..max_len, scale, -1.0f32..1.0).prop_flat_map(|(len, scale, mean_factor)| {
        (
            prop::collection::vec((-1.0f32..1.0, -1.0f32..1.0, -1.0f32..1.0), len),
            Just(scale),
            Just(mean_factor),
        )
            .prop_map(move |(u, scale, mean_factor)| {
                let offset = mean_factor * 100.0 * scale;
                let data = u
                    .iter()
                    .map(|&(a, b, c)| offset + (a + b + c) * scale)
                    .collect();
                (data, offset, scale)
            })
    })
}

/// Any value, with NaN, ±Inf, zeros, subnormals and values near ±f32::MAX well represented.
fn any_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -10.0f32..10.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => Just(f32::MIN_POSITIVE / 8.0),
        1 => (0.5f32..1.0).prop_map(|x| x * f32::MAX),
        1 => (0.5f32..1.0).prop_map(|x| -x * f32::MAX),
        1 => prop::num::f32::ANY,
    ]
}

/// Slices whose lengths cross the block sizes of every kernel (128, 256 and 512 elements).
fn mixed(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(any_value(), 0..max_len)
}

/// Mostly normal data with a few special values sprinkled in: most blocks take the fast path,
/// some the exact one.
fn sprinkled(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        normalish(max_len),
        prop::collection::vec((any::<prop::sample::Index>(), any_value()), 0..4),
    )
        .prop_map(|((mut data, _, _), specials)| {
            if !data.is_empty() {
                for (index, value) in specials {
                    let i = index.index(data.len());
                    data[i] = value;
                }
            }
            data
        })
}

proptest! {
    // Failures print their minimal input; cases worth keeping become the named tests below.
    #![proptest_config(ProptestConfig {
        // 256 cases per test, or `PROPTEST_CASES` (e.g. 100000 for a long search).
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn normal_data_matches_f64_reference((data, offset, scale) in normalish(3000)) {
        check_all_kernels(&data, offset.abs() >= scale)?;
    }

    #[test]
    fn special_values_match_f64_reference(data in mixed(1200)) {
        check_all_kernels(&data, false)?;
    }

    #[test]
    fn sprinkled_special_values_match_f64_reference(data in sprinkled(3000)) {
        check_all_kernels(&data, false)?;
    }

    #[test]
    fn merge_of_a_split_equals_the_whole(
        (data, _, _) in normalish(2000),
        split in any::<prop::sample::Index>(),
    ) {
        let at = if data.is_empty() { 0 } else { split.index(data.len() + 1) };
        let (left, right) = data.split_at(at);
        let whole = TensorStats::from_slice(&data);
        let (left, right) = (TensorStats::from_slice(left), TensorStats::from_slice(right));
        for merged in [left.merge(&right), right.merge(&left)] {
            check_merged(&merged, &whole)?;
        }
    }

    #[test]
    fn merge_with_special_values_equals_the_whole(
        data in sprinkled(2000),
        split in any::<prop::sample::Index>(),
    ) {
        let at = if data.is_empty() { 0 } else { split.index(data.len() + 1) };
        let (left, right) = data.split_at(at);
        let merged = TensorStats::from_slice(left).merge(&TensorStats::from_slice(right));
        check_merged(&merged, &TensorStats::from_slice(&data))?;
    }

    #[test]
    fn merge_of_many_chunks_equals_the_whole(
        (data, _, _) in normalish(5000),
        chunk in 1usize..700,
    ) {
        let merged = data
            .chunks(chunk)
            .map(TensorStats::from_slice)
            .fold(TensorStats::default(), |acc, part| acc.merge(&part));
        check_merged(&merged, &TensorStats::from_slice(&data))?;
    }

    #[test]
    fn serde_json_round_trips_every_result(data in mixed(600), split in any::<prop::sample::Index>()) {
        let at = if data.is_empty() { 0 } else { split.index(data.len() + 1) };
        let (left, right) = data.split_at(at);
        let merged = TensorStats::from_slice(left).merge(&TensorStats::from_slice(right));
        for stats in [TensorStats::from_slice(&data), merged] {
            let json = serde_json::to_string(&stats).unwrap();
            let back: TensorStats = serde_json::from_str(&json).unwrap();
            prop_assert!(same(&back, &stats), "{json} -> {back:?} != {stats:?}");
        }
    }
}

/// `merge` goes through the `f32` fields, so it is held to the precision of those.
fn check_merged(merged: &TensorStats, whole: &TensorStats) -> Result<(), TestCaseError> {
    prop_assert_eq!(merged.count, whole.count);
    prop_assert_eq!(merged.nan_count, whole.nan_count);
    prop_assert_eq!(merged.inf_count, whole.inf_count);
    prop_assert_eq!(merged.min, whole.min);
    prop_assert_eq!(merged.max, whole.max);
    let spread = f64::from(whole.std);
    let close = |a: f32, b: f32, scale: f64| rel(a, f64::from(b), scale) <= 1e-5;
    prop_assert!(
        close(merged.mean, whole.mean, spread),
        "mean {merged:?} vs {whole:?}"
    );
    // The merged std depends on the difference of the two f32 means: ~1e-7 of |mean| each.
    prop_assert!(
        close(merged.std, whole.std, 0.1 * f64::from(whole.mean.abs())),
        "std {merged:?} vs {whole:?}"
    );
    prop_assert!(
        close(merged.l2_norm, whole.l2_norm, 0.0)
            || (merged.l2_norm.is_infinite() && whole.l2_norm.is_infinite()),
        "l2 {merged:?} vs {whole:?}"
    );
    Ok(())
}

/// Equality that treats NaN as equal to NaN.
fn same(a: &TensorStats, b: &TensorStats) -> bool {
    let eq = |x: f32, y: f32| x == y || (x.is_nan() && y.is_nan());
    a.count == b.count
        && a.nan_count == b.nan_count
        && a.inf_count == b.inf_count
        && eq(a.min, b.min)
        && eq(a.max, b.max)
        && eq(a.mean, b.mean)
        && eq(a.std, b.std)
        && eq(a.l2_norm, b.l2_norm)
}

#[test]
fn every_kernel_the_cpu_supports_is_detected_and_runs() {
    let detected = StatsKernel::detected();
    assert_eq!(detected, StatsKernel::detected(), "detection is cached");
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let expected = if avx2 && is_x86_feature_detected!("avx512f") {
            StatsKernel::Avx512
        } else if avx2 {
            StatsKernel::Avx2
        } else {
            StatsKernel::Portable
        };
        assert_eq!(detected, expected);
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert_eq!(detected, StatsKernel::Portable);
    let data = [1.0f32, -2.0, 3.5];
    for kernel in StatsKernel::ALL {
        let ran = TensorStats::from_slice_with(&data, kernel);
        assert_eq!(ran.is_some(), kernel <= detected, "{kernel:?}");
        assert_eq!(ran.is_some(), kernel.is_available(), "{kernel:?}");
    }
    assert_eq!(
        TensorStats::from_slice_with(&data, detected),
        Some(TensorStats::from_slice(&data))
    );
}

#[test]
fn kernels_agree_at_every_length_up_to_three_blocks() {
    let data: Vec<f32> = (0..1600)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 3.0)
        .collect();
    for len in 0..data.len() {
        let slice = &data[..len];
        for (kernel, stats) in all_kernels(slice) {
            check(&stats, slice, false).unwrap_or_else(|e| panic!("len {len}, {kernel}: {e}"));
        }
    }
}

#[test]
fn a_large_mean_keeps_std_precise() {
    // Mean 1e6, spread ~1: E[x²] - E[x]² in f32 would lose every digit of the variance.
    let data: Vec<f32> = (0..100_000)
        .map(|i| 1e6 + ((i * 37) % 101) as f32 * 0.02 - 1.0)
        .collect();
    for (kernel, stats) in all_kernels(&data) {
        check(&stats, &data, true).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    }
}

#[test]
fn drifting_data_keeps_std_precise() {
    // The level jumps by 1e4 every 1000 elements: a shift chosen from the first block only
    // would be far from later blocks.
    let data: Vec<f32> = (0..20_000)
        .map(|i| (i / 1000) as f32 * 1e4 + ((i * 31) % 17) as f32 * 0.1)
        .collect();
    for (kernel, stats) in all_kernels(&data) {
        check(&stats, &data, true).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    }
}

#[test]
fn an_outlier_picked_as_shift_sample_keeps_the_norm_precise() {
    // Found by proptest: tiny values and one outlier at a position `block_shift` samples, which
    // pulls the shift far from the rest of the block. The norm is summed unshifted for this.
    let mut data: Vec<f32> = (0..2241)
        .map(|i| 6.5e-9 + ((i * 13) % 7) as f32 * 1e-11)
        .collect();
    data[512] = -4.344_088;
    data[1024 + 64] = 3.5;
    for (kernel, stats) in all_kernels(&data) {
        check(&stats, &data, false).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    }
}

#[test]
fn tiny_values_keep_their_norm_and_spread() {
    // Found by proptest (CI): one subnormal value, whose f32 square underflows to 0, gave an
    // l2_norm of 0. Squares of anything below ~1e-19 underflow or lose bits.
    let subnormal = [1.469_368e-39f32];
    let spread: Vec<f32> = (0..1000).map(|i| (i % 17) as f32 * 3e-21 - 2e-20).collect();
    let near_threshold: Vec<f32> = (0..700).map(|i| 9e-13 + (i % 5) as f32 * 1e-19).collect();
    let with_zeros: Vec<f32> = (0..600)
        .map(|i| {
            if i % 3 == 0 {
                0.0
            } else {
                2e-30 * (i % 7) as f32
            }
        })
        .collect();
    for data in [&subnormal[..], &spread, &near_threshold, &with_zeros] {
        for (kernel, stats) in all_kernels(data) {
            check(&stats, data, false).unwrap_or_else(|e| panic!("{kernel}: {e}"));
            assert!(stats.l2_norm > 0.0, "{kernel}: {stats:?}");
        }
    }
    // All zeros stay on the fast path and are exact there.
    let zeros = TensorStats::from_slice(&[0.0; 300]);
    assert_eq!((zeros.mean, zeros.std, zeros.l2_norm), (0.0, 0.0, 0.0));
}

#[test]
fn values_near_f32_max_do_not_overflow_the_sums() {
    let data = [f32::MAX, f32::MAX * 0.5, -f32::MAX, 1.0];
    for (kernel, stats) in all_kernels(&data) {
        check(&stats, &data, false).unwrap_or_else(|e| panic!("{kernel}: {e}"));
        assert_eq!(stats.l2_norm, f32::INFINITY, "{kernel}");
        assert!(stats.mean.is_finite() && stats.std.is_finite(), "{kernel}");
    }
    let one = TensorStats::from_slice(&[f32::MAX]);
    assert_eq!(
        (one.mean, one.std, one.l2_norm, one.min),
        (f32::MAX, 0.0, f32::MAX, f32::MAX)
    );
}

#[test]
fn empty_and_single_element() {
    assert_eq!(TensorStats::from_slice(&[]), TensorStats::default());
    let one = TensorStats::from_slice(&[-2.5]);
    assert_eq!(
        (one.count, one.min, one.max, one.mean, one.std, one.l2_norm),
        (1, -2.5, -2.5, -2.5, 0.0, 2.5)
    );
}

#[test]
fn from_moments_of_raw_sums_matches_from_slice() {
    let data: Vec<f32> = (0..5000).map(|i| ((i % 97) as f32 - 40.0) * 0.3).collect();
    let finite = data.iter().map(|&x| f64::from(x));
    let moments = FiniteMoments {
        count: data.len(),
        sum: finite.clone().sum(),
        sum_sq: finite.map(|x| x * x).sum(),
        min: data.iter().copied().fold(f32::INFINITY, f32::min),
        max: data.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        ..FiniteMoments::default()
    };
    let stats = TensorStats::from_moments(&moments);
    check(&stats, &data, false).unwrap();
}
