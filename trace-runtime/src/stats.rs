//! Summary statistics of a tensor, computed in one pass with no allocation.

use serde::{Deserialize, Serialize};

/// Statistics of a tensor's values.
///
/// * `count` is the number of elements, **including** NaN and ±Inf.
/// * `min`, `max`, `mean`, `std` and `l2_norm` are computed over the finite elements only, so
///   one NaN does not hide the shape of the rest of the tensor; `nan_count` and `inf_count` say
///   how many were left out. With no finite element they are all `0.0`.
/// * `std` is the **population** standard deviation (divides by the number of finite elements).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorStats {
    /// Number of elements, including NaN and ±Inf.
    pub count: usize,
    /// Smallest finite value.
    pub min: f32,
    /// Largest finite value.
    pub max: f32,
    /// Mean of the finite values.
    pub mean: f32,
    /// Population standard deviation of the finite values.
    pub std: f32,
    /// Euclidean norm of the finite values.
    pub l2_norm: f32,
    /// Number of NaN elements.
    pub nan_count: usize,
    /// Number of +Inf or -Inf elements.
    pub inf_count: usize,
}

impl TensorStats {
    /// Computes the statistics of `data` in one pass.
    pub fn from_slice(data: &[f32]) -> Self {
        let mut acc = Accumulator::default();
        for &x in data {
            acc.push(x);
        }
        acc.finish(data.len())
    }
}

/// Running sums of one pass, shifted by the first finite value so that `std` keeps its
/// precision when the mean is large compared to the spread.
#[derive(Default)]
struct Accumulator {
    finite: usize,
    nan: usize,
    inf: usize,
    shift: f64,
    sum: f64,
    sum_sq: f64,
    l2: f64,
    min: f32,
    max: f32,
}

impl Accumulator {
    fn push(&mut self, x: f32) {
        if x.is_nan() {
            self.nan += 1;
            return;
        }
        if x.is_infinite() {
            self.inf += 1;
            return;
        }
        if self.finite == 0 {
            self.shift = f64::from(x);
            self.min = x;
            self.max = x;
        }
        self.finite += 1;
        let v = f64::from(x);
        let d = v - self.shift;
        self.sum += d;
        self.sum_sq += d * d;
        self.l2 += v * v;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
    }

    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    fn finish(self, count: usize) -> TensorStats {
        if self.finite == 0 {
            return TensorStats {
                count,
                nan_count: self.nan,
                inf_count: self.inf,
                ..TensorStats::default()
            };
        }
        let n = self.finite as f64;
        let mean_d = self.sum / n;
        let var = (self.sum_sq / n - mean_d * mean_d).max(0.0);
        TensorStats {
            count,
            min: self.min,
            max: self.max,
            mean: (self.shift + mean_d) as f32,
            std: var.sqrt() as f32,
            l2_norm: self.l2.sqrt() as f32,
            nan_count: self.nan,
            inf_count: self.inf,
        }
    }
}
