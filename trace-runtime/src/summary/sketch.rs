//! A deterministic random-projection sketch: eight numbers that follow a tensor's values closely
//! enough to compare two frameworks' outputs within a tolerance, and change when values move
//! (reordered tokens, swapped heads), which statistics cannot see.
//!
//! The definition is part of the trace-file format (`docs/trace-format.md`), so that another
//! implementation (the Python writer) computes the same numbers:
//!
//! * element `i` (0-based, row-major over the whole tensor) gets the 64-bit hash
//!   `h(i) = mix(i · 0x9E3779B97F4A7C15 + SKETCH_SEED)` (wrapping `u64` arithmetic), with `mix`
//!   SplitMix64's finaliser;
//! * component `k` (0..8) is `Σ s_k(i) · x_i` over the finite `x_i`, where `s_k(i)` is `-1` if bit
//!   `k` of `h(i)` is set and `+1` otherwise;
//! * each component is summed in `f64`, in increasing `i`, starting from `+0.0`, then rounded
//!   once to `f32`. (numpy: `np.cumsum(terms, axis=0)[-1]` is that order; `np.sum` is not.)

use serde::{Deserialize, Serialize};

/// Components of a [`Sketch`].
pub const SKETCH_DIM: usize = 8;

/// Added to the scrambled index before mixing (the ASCII bytes of `"mdltrace"`).
pub const SKETCH_SEED: u64 = 0x6d64_6c74_7261_6365;

/// Multiplier that spreads consecutive indices over the 64-bit range (the golden ratio, as in
/// SplitMix64).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Eight seeded ±1 projections of a tensor's finite values.
///
/// For two tensors of the same shape whose values differ by `e_i`, component `k` differs by
/// `Σ s_k(i)·e_i`, so `|Δ| ≤ Σ|e_i|`: when every element is within `atol + rtol·|x_i|` of the
/// reference, every component is within `n·atol + rtol·Σ|x_i|` (see [`Sketch::bound`]), and a
/// component outside that bound proves the tensors are not close. A permutation of the values
/// moves each component by about `‖x − Px‖₂`, far beyond the bound of a small tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sketch(#[serde(with = "crate::record::float::array")] pub [f32; SKETCH_DIM]);

impl Sketch {
    /// The sketch of `data` (NaN and ±Inf are left out, like in the statistics).
    #[must_use]
    pub fn of(data: &[f32]) -> Self {
        let mut acc = [0.0f64; SKETCH_DIM];
        for (index, &x) in (0u64..).zip(data) {
            let value = if x.is_finite() { f64::from(x) } else { 0.0 };
            let hash = element_hash(index);
            for (k, slot) in acc.iter_mut().enumerate() {
                // -value is exact, so this is the sum of ±x_i the definition asks for.
                *slot += if (hash >> k) & 1 == 1 { -value } else { value };
            }
        }
        #[allow(clippy::cast_possible_truncation)]
        Self(acc.map(|sum| sum as f32))
    }

    /// The largest difference any component can have between two tensors of `count` elements
    /// that are elementwise close (`|a_i − b_i| ≤ atol + rtol·|b_i|`), given the reference's
    /// L2 norm: `count·atol + rtol·√count·‖b‖₂` (Cauchy–Schwarz bounds `Σ|b_i|` by `√n·‖b‖₂`).
    #[must_use]
    pub fn bound(count: usize, reference_l2: f64, atol: f64, rtol: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let n = count as f64;
        n * atol + rtol * n.sqrt() * reference_l2
    }
}

/// `h(i)` of the definition: SplitMix64's finaliser of the scrambled index.
#[inline]
#[must_use]
pub fn element_hash(index: u64) -> u64 {
    let mut z = index.wrapping_mul(GOLDEN_GAMMA).wrapping_add(SKETCH_SEED);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition written out as plainly as possible, to check the loop against.
    fn reference(data: &[f32]) -> [f32; SKETCH_DIM] {
        let mut out = [0.0f32; SKETCH_DIM];
        for (k, slot) in out.iter_mut().enumerate() {
            let mut sum = 0.0f64;
            for (i, &x) in data.iter().enumerate() {
                if !x.is_finite() {
                    continue;
                }
                let sign = if element_hash(i as u64) >> k & 1 == 1 {
                    -1.0
                } else {
                    1.0
                };
                sum += sign * f64::from(x);
            }
            *slot = sum as f32;
        }
        out
    }

    #[test]
    fn matches_the_definition_and_skips_non_finite_values() {
        let data: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        assert_eq!(Sketch::of(&data).0, reference(&data));
        let mut broken = data.clone();
        broken[3] = f32::NAN;
        broken[7] = f32::NEG_INFINITY;
        let mut zeroed = data.clone();
        zeroed[3] = 0.0;
        zeroed[7] = 0.0;
        assert_eq!(Sketch::of(&broken), Sketch::of(&zeroed));
        assert_eq!(Sketch::of(&[]).0, [0.0; SKETCH_DIM]);
    }

    #[test]
    fn known_values_pin_the_definition() {
        // Computed with plain Python integers and floats from the definition in the module docs;
        // the Python writer's tests pin the same numbers. Changing them changes the file format.
        let hashes: Vec<u64> = (0..4).map(element_hash).collect();
        assert_eq!(
            hashes,
            [
                0x98cf_04e2_063f_d812,
                0x3414_c8f4_8e32_b692,
                0x4c7e_b505_cfeb_18f0,
                0x566c_9da8_593b_eac1
            ]
        );
        let data = [0.5, -1.25, 3.0, 2f32.powi(-20), -7.75, 1e-3, 100.0];
        let expected = [
            0xc2d2ff7d, 0xc2b10083, 0xc2b40083, 0x42dc0083, 0x42d30083, 0x42d00083, 0xc2df0083,
            0xc2da0083,
        ]
        .map(f32::from_bits);
        assert_eq!(Sketch::of(&data).0, expected);
    }

    #[test]
    fn a_permutation_moves_the_sketch_but_not_the_statistics() {
        let rows: Vec<Vec<f32>> = (0..7)
            .map(|r| {
                (0..64)
                    .map(|c| ((r * 64 + c) as f32 * 0.731).sin())
                    .collect()
            })
            .collect();
        let forward: Vec<f32> = rows.concat();
        let reversed: Vec<f32> = rows.iter().rev().flatten().copied().collect();
        let (a, b) = (Sketch::of(&forward), Sketch::of(&reversed));
        let l2 = f64::from(crate::TensorStats::from_slice(&forward).l2_norm);
        let bound = Sketch::bound(forward.len(), l2, 1e-5, 1.3e-6);
        let moved = a.0.iter().zip(&b.0).map(|(x, y)| f64::from((x - y).abs()));
        assert!(moved.fold(0.0, f64::max) > 100.0 * bound);
    }

    #[test]
    fn close_tensors_stay_within_the_bound() {
        let reference: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.01).cos() * 3.0).collect();
        let (atol, rtol) = (1e-4, 1e-3);
        // the worst case: every error at its limit, with the sign of the first projection
        let other: Vec<f32> = reference
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let limit = (atol + rtol * f64::from(x.abs())) as f32 * 0.999;
                let sign = if element_hash(i as u64) & 1 == 1 {
                    -1.0
                } else {
                    1.0
                };
                x + sign * limit
            })
            .collect();
        let l2 = f64::from(crate::TensorStats::from_slice(&reference).l2_norm);
        let bound = Sketch::bound(reference.len(), l2, atol, rtol);
        let (a, b) = (Sketch::of(&reference), Sketch::of(&other));
        for (x, y) in a.0.iter().zip(&b.0) {
            assert!(f64::from((x - y).abs()) <= bound, "{x} {y} {bound}");
        }
        // and the first projection really is near the bound, so the bound is not slack
        assert!(f64::from((a.0[0] - b.0[0]).abs()) > 0.3 * bound);
    }
}
