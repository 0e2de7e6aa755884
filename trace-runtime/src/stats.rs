//! Summary statistics of a tensor, computed in one pass with no allocation.

mod kernel;
pub(crate) mod top_k;
#[cfg(target_arch = "x86_64")]
mod x86;

use serde::{Deserialize, Serialize};

#[doc(hidden)]
pub use kernel::StatsKernel;
pub use top_k::top_k_by_selection;

/// Statistics of a tensor's values.
///
/// * `count` is the number of elements, **including** NaN and ±Inf.
/// * `min`, `max`, `mean`, `std` and `l2_norm` are computed over the finite elements only, so
///   one NaN does not hide the shape of the rest of the tensor; `nan_count` and `inf_count` say
///   how many were left out. With no finite element they are all `0.0`.
/// * `std` is the **population** standard deviation (divides by the number of finite elements).
///
/// Non-finite statistics: `l2_norm` is `+Inf` when the norm of finite values exceeds `f32::MAX`
/// (possible with values near `f32::MAX`; the sums themselves are `f64` and do not overflow).
/// [`from_moments`](Self::from_moments) gives NaN `mean` and `std` when the device sums
/// overflowed. Both survive serialization: non-finite values are written as the strings `"NaN"`,
/// `"inf"` and `"-inf"` (see the trace-file format).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorStats {
    /// Number of elements, including NaN and ±Inf.
    pub count: usize,
    /// Smallest finite value.
    #[serde(with = "crate::float::single")]
    pub min: f32,
    /// Largest finite value.
    #[serde(with = "crate::float::single")]
    pub max: f32,
    /// Mean of the finite values.
    #[serde(with = "crate::float::single")]
    pub mean: f32,
    /// Population standard deviation of the finite values: `sqrt(Σ (x - mean)² / n)` with `n`
    /// the number of finite values.
    ///
    /// Not the *sample* standard deviation (which divides by `n - 1`, and gives `1.58` for
    /// `[1, 2, 3, 4, 5]` where this gives `sqrt(2) ≈ 1.414`; `torch.std` and `np.std(ddof=1)`
    /// are sample, `np.std` is population). The population form is the one that merges exactly
    /// ([`merge`](Self::merge)) and is defined for a single element (`0.0`).
    #[serde(with = "crate::float::single")]
    pub std: f32,
    /// Euclidean norm of the finite values; `+Inf` when it exceeds `f32::MAX`.
    #[serde(with = "crate::float::single")]
    pub l2_norm: f32,
    /// Number of NaN elements.
    pub nan_count: usize,
    /// Number of +Inf or -Inf elements.
    pub inf_count: usize,
}

/// Sums over the finite elements of a tensor, as a device reduction produces them; the input of
/// [`TensorStats::from_moments`].
///
/// The sums are of `x - shift`: `shift = 0.0` gives plain sums. A shift near the mean (say, the
/// first element) keeps `std` precise when the mean is large compared to the spread and the device
/// sums in `f32`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FiniteMoments {
    /// Number of elements, including NaN and ±Inf.
    pub count: usize,
    /// Number of NaN elements.
    pub nan_count: usize,
    /// Number of ±Inf elements.
    pub inf_count: usize,
    /// Point the sums are measured from.
    pub shift: f64,
    /// Σ (x - shift) over the finite elements.
    pub sum: f64,
    /// Σ (x - shift)² over the finite elements.
    pub sum_sq: f64,
    /// Smallest finite element (ignored when there is none).
    pub min: f32,
    /// Largest finite element (ignored when there is none).
    pub max: f32,
}

impl TensorStats {
    /// `|min|` or `|max|` above this is an explosion.
    pub const EXPLOSION_ABS: f32 = 1e6;
    /// `std` above this is an explosion.
    pub const EXPLOSION_STD: f32 = 1e4;
    /// `std` below this is vanishing (see [`is_vanishing`](Self::is_vanishing)).
    pub const VANISHING_STD: f32 = 1e-6;

    /// Computes the statistics of `data` in one pass, without allocating.
    ///
    /// Runs the widest kernel this CPU supports (AVX-512F, AVX2 with FMA, or portable code),
    /// chosen once per process. Against an exact `f64` computation, `l2_norm` is within 1e-6
    /// relative, `std` within 1e-5 and `mean` within 1e-6 of `max(|mean|, std)` (in tests the
    /// error is ~1e-7, the rounding of the `f32` result), beyond the rounding of the exact value
    /// to `f32` (coarser than 1e-7 below 1.2e-38, `f32`'s subnormal range). A block of a few
    /// hundred elements that holds a NaN or ±Inf is summed a second time without them, so NaN
    /// scattered all over costs up to ~4x finite data; finite values beyond 1.8e19 (whose squares
    /// overflow `f32`) fall back to scalar `f64`, ~15x, and so does a slice whose finite values
    /// are all below 9.1e-13 in magnitude, but not all zero (their squares would underflow).
    #[must_use]
    pub fn from_slice(data: &[f32]) -> Self {
        kernel::reduce(data).into_stats(data.len())
    }

    /// [`from_slice`](Self::from_slice) with the portable kernel, whatever the CPU.
    #[doc(hidden)]
    #[must_use]
    pub fn from_slice_portable(data: &[f32]) -> Self {
        kernel::reduce_portable(data).into_stats(data.len())
    }

    /// [`from_slice`](Self::from_slice) with a chosen kernel; `None` if this CPU cannot run it.
    #[doc(hidden)]
    #[must_use]
    pub fn from_slice_with(data: &[f32], kernel: StatsKernel) -> Option<Self> {
        kernel::reduce_with(data, kernel).map(|totals| totals.into_stats(data.len()))
    }

    /// Builds statistics from sums a backend computed where the data lives (a GPU), so that the
    /// tensor never has to be copied to the host.
    ///
    /// The finite count is `count - nan_count - inf_count`; `l2_norm` is
    /// `sqrt(sum_sq + 2·shift·sum + n·shift²)`. The precision is that of the sums: with
    /// `shift = 0` and `f32` sums, `std` loses digits when `|mean| ≫ std`. If the sums
    /// overflowed (are not finite), `mean` and `std` are NaN and `l2_norm` is `+Inf`, which
    /// [`has_anomaly`](Self::has_anomaly) reports as an explosion.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    #[must_use]
    pub fn from_moments(moments: &FiniteMoments) -> Self {
        let finite = moments
            .count
            .saturating_sub(moments.nan_count.saturating_add(moments.inf_count));
        let mut stats = TensorStats {
            count: moments.count,
            nan_count: moments.nan_count,
            inf_count: moments.inf_count,
            ..TensorStats::default()
        };
        if finite == 0 {
            return stats;
        }
        stats.min = moments.min;
        stats.max = moments.max;
        if !(moments.sum.is_finite() && moments.sum_sq.is_finite()) {
            stats.mean = f32::NAN;
            stats.std = f32::NAN;
            stats.l2_norm = f32::INFINITY;
            return stats;
        }
        let n = finite as f64;
        let mean_dev = moments.sum / n;
        let var = moments.sum_sq / n - mean_dev * mean_dev;
        let shift = moments.shift;
        let sq = moments.sum_sq + shift * (2.0 * moments.sum + n * shift);
        stats.mean = bound_mean(shift + mean_dev, stats.min, stats.max);
        stats.std = bound_std(var, stats.min, stats.max);
        stats.l2_norm = sq.max(0.0).sqrt() as f32;
        stats
    }

    /// Number of finite elements, the ones `min` to `l2_norm` describe.
    #[must_use]
    pub fn finite_count(&self) -> usize {
        self.count
            .saturating_sub(self.nan_count.saturating_add(self.inf_count))
    }

    /// Statistics of the concatenation of the two tensors these describe, in either order.
    ///
    /// Means and variances combine with Chan et al.'s parallel formula in `f64`. The result
    /// matches [`from_slice`](Self::from_slice) of the whole within the rounding of the stored
    /// `f32` fields (~1e-6 relative for `mean`, `std`, `l2_norm`).
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    #[must_use]
    pub fn merge(&self, other: &TensorStats) -> TensorStats {
        let (na, nb) = (self.finite_count(), other.finite_count());
        let mut merged = match (na, nb) {
            (_, 0) => *self,
            (0, _) => *other,
            _ => {
                let (na, nb) = (na as f64, nb as f64);
                let n = na + nb;
                let (mean_a, mean_b) = (f64::from(self.mean), f64::from(other.mean));
                let delta = mean_b - mean_a;
                let (std_a, std_b) = (f64::from(self.std), f64::from(other.std));
                let m2 = std_a * std_a * na + std_b * std_b * nb + delta * delta * na * nb / n;
                let min = self.min.min(other.min);
                let max = self.max.max(other.max);
                TensorStats {
                    min,
                    max,
                    mean: bound_mean(mean_a + delta * nb / n, min, max),
                    std: bound_std(m2 / n, min, max),
                    l2_norm: f64::from(self.l2_norm).hypot(f64::from(other.l2_norm)) as f32,
                    ..TensorStats::default()
                }
            }
        };
        merged.count = self.count.saturating_add(other.count);
        merged.nan_count = self.nan_count.saturating_add(other.nan_count);
        merged.inf_count = self.inf_count.saturating_add(other.inf_count);
        merged
    }

    /// True when the tensor has NaN, ±Inf, or has exploded: `|min|` or `|max|` above
    /// [`EXPLOSION_ABS`](Self::EXPLOSION_ABS), `std` above
    /// [`EXPLOSION_STD`](Self::EXPLOSION_STD), or sums too large to represent.
    #[must_use]
    pub fn has_anomaly(&self) -> bool {
        self.nan_count > 0 || self.inf_count > 0 || self.has_large_values() || self.has_large_std()
    }

    /// Names every anomaly of [`has_anomaly`](Self::has_anomaly) (`NaN`, `Inf`, `explosion`),
    /// with the numbers that triggered it; `None` when there is none.
    #[must_use]
    pub fn anomaly_description(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.nan_count > 0 {
            parts.push(format!("NaN: {} of {} values", self.nan_count, self.count));
        }
        if self.inf_count > 0 {
            parts.push(format!("Inf: {} of {} values", self.inf_count, self.count));
        }
        if self.has_large_values() {
            parts.push(format!(
                "explosion: min {:.3e}, max {:.3e} (|x| > {:.0e})",
                self.min,
                self.max,
                Self::EXPLOSION_ABS
            ));
        }
        if self.has_large_std() {
            if self.mean.is_finite() && self.std.is_finite() && self.l2_norm.is_finite() {
                parts.push(format!(
                    "explosion: std {:.3e} > {:.0e}",
                    self.std,
                    Self::EXPLOSION_STD
                ));
            } else {
                parts.push(format!(
                    "explosion: mean {}, std {}, l2_norm {} overflow",
                    self.mean, self.std, self.l2_norm
                ));
            }
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// True when the finite values barely vary: `std` below
    /// [`VANISHING_STD`](Self::VANISHING_STD).
    ///
    /// Only meaningful with more than one finite value, so fewer never count as vanishing. Early
    /// layers (embeddings) can legitimately look like this; the layer-level check skips warm-up
    /// layers for that reason.
    #[must_use]
    pub fn is_vanishing(&self) -> bool {
        self.finite_count() > 1 && self.std < Self::VANISHING_STD
    }

    fn has_large_values(&self) -> bool {
        self.min.abs() > Self::EXPLOSION_ABS || self.max.abs() > Self::EXPLOSION_ABS
    }

    /// `std` too large, or a statistic that overflowed (NaN `mean`/`std`, `+Inf` `l2_norm`).
    fn has_large_std(&self) -> bool {
        let overflowed = self.finite_count() > 0
            && !(self.mean.is_finite() && self.std.is_finite() && self.l2_norm.is_finite());
        overflowed || self.std > Self::EXPLOSION_STD
    }
}

impl kernel::Totals {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    fn into_stats(self, count: usize) -> TensorStats {
        let mut stats = TensorStats {
            count,
            nan_count: self.nan,
            inf_count: self.inf,
            ..TensorStats::default()
        };
        if self.finite == 0 {
            return stats;
        }
        let n = self.finite as f64;
        let mean_dev = self.dev_sum / n;
        stats.min = self.min;
        stats.max = self.max;
        stats.mean = bound_mean(self.reference + mean_dev, self.min, self.max);
        stats.std = bound_std(self.dev_sq / n - mean_dev * mean_dev, self.min, self.max);
        stats.l2_norm = self.sq.sqrt() as f32;
        stats
    }
}

/// The mean lies in `[min, max]`; rounding can push the computed one just outside, which would
/// also risk an `f32` overflow near `f32::MAX`.
#[allow(clippy::cast_possible_truncation)]
fn bound_mean(mean: f64, min: f32, max: f32) -> f32 {
    if mean.is_nan() {
        return f32::NAN;
    }
    mean.max(f64::from(min)).min(f64::from(max)) as f32
}

/// `sqrt(variance)`, at most half the range (Popoviciu's inequality), so constant data gets an
/// exact `0.0` whatever the rounding of the sums. NaN stays NaN.
#[allow(clippy::cast_possible_truncation)]
fn bound_std(variance: f64, min: f32, max: f32) -> f32 {
    if variance.is_nan() {
        return f32::NAN;
    }
    let half_range = (f64::from(max) - f64::from(min)) / 2.0;
    variance.max(0.0).sqrt().min(half_range.max(0.0)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn seed_example_one_to_five() {
        let stats = TensorStats::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(stats.count, 5);
        assert_eq!(stats.min, 1.0);
        assert_eq!(stats.max, 5.0);
        assert_eq!(stats.mean, 3.0);
        // Population std; the seed's 1.58 is the sample std sqrt(10 / 4).
        assert!(close(stats.std, 2.0f32.sqrt(), 1e-6), "{}", stats.std);
        assert!(
            close(stats.l2_norm, 55.0f32.sqrt(), 1e-6),
            "{}",
            stats.l2_norm
        );
        assert_eq!((stats.nan_count, stats.inf_count), (0, 0));
        assert!(!stats.has_anomaly());
        assert_eq!(stats.anomaly_description(), None);
    }

    #[test]
    fn seed_example_nan_is_an_anomaly() {
        let stats = TensorStats::from_slice(&[1.0, f32::NAN, 3.0]);
        assert!(stats.has_anomaly());
        let description = stats.anomaly_description().unwrap();
        assert!(description.contains("NaN"), "{description}");
        assert_eq!(stats.count, 3);
        assert_eq!(stats.nan_count, 1);
        assert_eq!(stats.mean, 2.0);
        assert_eq!((stats.min, stats.max), (1.0, 3.0));
    }

    #[test]
    fn seed_example_explosion() {
        let stats = TensorStats::from_slice(&[1.0, 1e7, 3.0]);
        assert!(stats.has_anomaly());
        let description = stats.anomaly_description().unwrap();
        assert!(description.contains("explosion"), "{description}");
    }

    #[test]
    fn seed_example_vanishing() {
        let stats = TensorStats::from_slice(&[1.0, 1.0, 1.0]);
        assert!(stats.is_vanishing());
        assert_eq!(stats.std, 0.0);
        assert!(!stats.has_anomaly());
    }

    #[test]
    fn inf_is_an_anomaly_and_left_out_of_the_statistics() {
        let stats = TensorStats::from_slice(&[f32::NEG_INFINITY, 2.0, f32::INFINITY, 4.0]);
        assert_eq!(
            (stats.count, stats.inf_count, stats.finite_count()),
            (4, 2, 2)
        );
        assert_eq!((stats.min, stats.max, stats.mean), (2.0, 4.0, 3.0));
        let description = stats.anomaly_description().unwrap();
        assert!(description.contains("Inf") && !description.contains("NaN"));
    }

    #[test]
    fn large_std_is_an_explosion() {
        let stats = TensorStats::from_slice(&[-9e5, 9e5]);
        assert!(stats.std > TensorStats::EXPLOSION_STD);
        assert!(stats.has_anomaly());
        assert!(stats
            .anomaly_description()
            .unwrap()
            .contains("explosion: std"));
    }

    #[test]
    fn vanishing_needs_two_finite_values() {
        assert!(!TensorStats::from_slice(&[]).is_vanishing());
        assert!(!TensorStats::from_slice(&[0.5]).is_vanishing());
        assert!(!TensorStats::from_slice(&[0.5, f32::NAN]).is_vanishing());
        assert!(TensorStats::from_slice(&[0.5, 0.5]).is_vanishing());
        assert!(!TensorStats::from_slice(&[0.5, 0.6]).is_vanishing());
    }

    #[test]
    fn no_finite_value_gives_zeros() {
        let stats = TensorStats::from_slice(&[f32::NAN, f32::INFINITY]);
        assert_eq!(
            stats,
            TensorStats {
                count: 2,
                nan_count: 1,
                inf_count: 1,
                ..TensorStats::default()
            }
        );
        assert_eq!(TensorStats::from_slice(&[]), TensorStats::default());
    }

    #[test]
    fn from_moments_matches_from_slice() {
        let data: Vec<f32> = (0..1000).map(|i| 100.0 + (i % 17) as f32 * 0.25).collect();
        let expected = TensorStats::from_slice(&data);
        let shift = f64::from(data[0]);
        let moments = FiniteMoments {
            count: data.len() + 1,
            nan_count: 1,
            inf_count: 0,
            shift,
            sum: data.iter().map(|&x| f64::from(x) - shift).sum(),
            sum_sq: data.iter().map(|&x| (f64::from(x) - shift).powi(2)).sum(),
            min: 100.0,
            max: 104.0,
        };
        let stats = TensorStats::from_moments(&moments);
        assert_eq!((stats.count, stats.nan_count), (1001, 1));
        assert!(close(stats.mean, expected.mean, 1e-6));
        assert!(close(stats.std, expected.std, 1e-6));
        assert!(close(stats.l2_norm, expected.l2_norm, 1e-6));
    }

    #[test]
    fn from_moments_with_overflowed_sums_is_an_explosion() {
        let stats = TensorStats::from_moments(&FiniteMoments {
            count: 4,
            sum: f64::INFINITY,
            sum_sq: f64::INFINITY,
            min: 1.0,
            max: 2.0,
            ..FiniteMoments::default()
        });
        assert!(stats.mean.is_nan() && stats.std.is_nan());
        assert_eq!(stats.l2_norm, f32::INFINITY);
        assert!(stats.has_anomaly());
        assert!(stats.anomaly_description().unwrap().contains("explosion"));
    }

    #[test]
    fn merge_with_an_empty_side_keeps_the_other() {
        let a = TensorStats::from_slice(&[1.0, 2.0, 3.0]);
        let nan = TensorStats::from_slice(&[f32::NAN]);
        let merged = a.merge(&nan);
        assert_eq!(merged.count, 4);
        assert_eq!(merged.nan_count, 1);
        assert_eq!(
            (merged.mean, merged.std, merged.min),
            (a.mean, a.std, a.min)
        );
        assert_eq!(nan.merge(&a), merged);
        assert_eq!(a.merge(&TensorStats::default()), a);
    }

    #[test]
    fn serde_json_round_trip_keeps_overflowed_l2_norm() {
        let stats = TensorStats::from_slice(&[f32::MAX, f32::MAX, f32::NAN]);
        assert_eq!(stats.l2_norm, f32::INFINITY);
        let json = serde_json::to_string(&stats).unwrap();
        assert!(json.contains("\"l2_norm\":\"inf\""), "{json}");
        let back: TensorStats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stats);
        let moments = FiniteMoments {
            count: 2,
            sum: f64::INFINITY,
            sum_sq: f64::INFINITY,
            ..FiniteMoments::default()
        };
        let overflowed = TensorStats::from_moments(&moments);
        assert!(overflowed.mean.is_nan());
        let json = serde_json::to_string(&overflowed).unwrap();
        assert!(json.contains("\"mean\":\"NaN\""), "{json}");
        let back: TensorStats = serde_json::from_str(&json).unwrap();
        assert!(back.mean.is_nan() && back.std.is_nan());
        assert_eq!(back.l2_norm, overflowed.l2_norm);
    }
}
