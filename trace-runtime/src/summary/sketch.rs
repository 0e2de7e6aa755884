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
pub struct Sketch(#[serde(with = "crate::float::array")] pub [f32; SKETCH_DIM]);

impl Sketch {
    /// The sketch of `data` (NaN and ±Inf are left out, like in the statistics).
    ///
    /// Flipping a sign is flipping the sign bit, so each element costs a table look-up of its
    /// eight sign bits (the low byte of `h(i)`, cached for the first indices), eight XORs and
    /// eight adds into eight independent `f64` accumulators, which the compiler vectorises; the
    /// order of the additions per component is the definition's, so the result is exact.
    #[must_use]
    pub fn of(data: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, the only requirement of `sums_avx2`.
            return Self(unsafe { sums_avx2(data) });
        }
        Self(sums(data))
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

/// Indices whose sign bits are cached: tensors up to this size (64 Ki values) never hash.
const CACHED_INDICES: usize = 1 << 16;

/// For each byte of sign bits, the eight lanes' sign masks: lane `k` has the `f64` sign bit
/// set when bit `k` of the byte is.
const LANE_SIGNS: [[u64; SKETCH_DIM]; 256] = {
    let mut table = [[0u64; SKETCH_DIM]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut lane = 0;
        while lane < SKETCH_DIM {
            if (byte >> lane) & 1 == 1 {
                table[byte][lane] = 1 << 63;
            }
            lane += 1;
        }
        byte += 1;
    }
    table
};

/// The components, rounded to `f32`.
#[inline(always)]
fn sums(data: &[f32]) -> [f32; SKETCH_DIM] {
    let mut acc = [0.0f64; SKETCH_DIM];
    let cached = data.len().min(CACHED_INDICES);
    for (&x, &byte) in data[..cached].iter().zip(sign_bytes()) {
        accumulate(&mut acc, x, byte);
    }
    for (index, &x) in (cached as u64..).zip(&data[cached..]) {
        #[allow(clippy::cast_possible_truncation)]
        accumulate(&mut acc, x, element_hash(index) as u8);
    }
    #[allow(clippy::cast_possible_truncation)]
    acc.map(|sum| sum as f32)
}

/// [`sums`] with AVX2: the eight lanes are two registers, four values are loaded, cleared of
/// non-finite ones and widened to `f64` at once, then added one by one. The same additions in
/// the same order, so the same result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sums_avx2(data: &[f32]) -> [f32; SKETCH_DIM] {
    use std::arch::x86_64::{
        __m256d, __m256i, _mm256_add_pd, _mm256_castsi256_pd, _mm256_cvtpd_ps, _mm256_cvtps_pd,
        _mm256_loadu_si256, _mm256_permute4x64_pd, _mm256_setzero_pd, _mm256_xor_pd, _mm_and_ps,
        _mm_castsi128_ps, _mm_cmplt_ps, _mm_loadu_ps, _mm_set1_epi32, _mm_set1_ps, _mm_storeu_ps,
    };

    /// Adds `±value` (all four lanes of `value` hold it) to the two halves of the accumulator.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add(lo: &mut __m256d, hi: &mut __m256d, value: __m256d, byte: u8) {
        let signs = &LANE_SIGNS[usize::from(byte)];
        // SAFETY: `signs` is 8 `u64`s, 64 bytes: the two unaligned 32-byte loads read exactly it.
        let (s_lo, s_hi) = unsafe {
            (
                _mm256_loadu_si256(signs.as_ptr().cast::<__m256i>()),
                _mm256_loadu_si256(signs.as_ptr().add(4).cast::<__m256i>()),
            )
        };
        *lo = _mm256_add_pd(*lo, _mm256_xor_pd(value, _mm256_castsi256_pd(s_lo)));
        *hi = _mm256_add_pd(*hi, _mm256_xor_pd(value, _mm256_castsi256_pd(s_hi)));
    }

    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fff_ffff));
    let infinity = _mm_set1_ps(f32::INFINITY);
    let cached = data.len().min(CACHED_INDICES);
    let bytes = sign_bytes();
    let quads = data[..cached].chunks_exact(4).zip(bytes.chunks_exact(4));
    let index = cached / 4 * 4;
    for (quad, signs) in quads {
        // SAFETY: `quad` holds exactly 4 `f32`, what the unaligned 16-byte load reads.
        let values = unsafe { _mm_loadu_ps(quad.as_ptr()) };
        // |x| < inf is false for NaN and ±inf: those become +0.0.
        let finite = _mm_cmplt_ps(_mm_and_ps(values, abs_mask), infinity);
        let wide = _mm256_cvtps_pd(_mm_and_ps(values, finite));
        let &[b0, b1, b2, b3] = signs else { continue };
        add(&mut lo, &mut hi, _mm256_permute4x64_pd::<0x00>(wide), b0);
        add(&mut lo, &mut hi, _mm256_permute4x64_pd::<0x55>(wide), b1);
        add(&mut lo, &mut hi, _mm256_permute4x64_pd::<0xAA>(wide), b2);
        add(&mut lo, &mut hi, _mm256_permute4x64_pd::<0xFF>(wide), b3);
    }
    let mut acc = [0.0f32; SKETCH_DIM];
    // SAFETY: `acc` is 8 `f32`: each store writes 4 of them.
    unsafe {
        _mm_storeu_ps(acc.as_mut_ptr(), _mm256_cvtpd_ps(lo));
        _mm_storeu_ps(acc.as_mut_ptr().add(4), _mm256_cvtpd_ps(hi));
    }
    if index == data.len() {
        return acc;
    }
    // The rest, from where the registers stopped: back to f64 lanes (the f32 above were only
    // for the early return; recompute from the registers' exact sums).
    let mut wide = [0.0f64; SKETCH_DIM];
    // SAFETY: `wide` is 8 `f64`: each store writes 4 of them.
    unsafe {
        std::arch::x86_64::_mm256_storeu_pd(wide.as_mut_ptr(), lo);
        std::arch::x86_64::_mm256_storeu_pd(wide.as_mut_ptr().add(4), hi);
    }
    for (&x, &byte) in data[index..cached].iter().zip(&bytes[index..]) {
        accumulate(&mut wide, x, byte);
    }
    for (i, &x) in (cached as u64..).zip(&data[cached..]) {
        #[allow(clippy::cast_possible_truncation)]
        accumulate(&mut wide, x, element_hash(i) as u8);
    }
    #[allow(clippy::cast_possible_truncation)]
    wide.map(|sum| sum as f32)
}

/// `±x` into each accumulator, the signs from `byte`; a non-finite `x` adds zeros.
#[inline(always)]
fn accumulate(acc: &mut [f64; SKETCH_DIM], x: f32, byte: u8) {
    let value = if x.is_finite() { f64::from(x) } else { 0.0 };
    let bits = value.to_bits();
    let signs = &LANE_SIGNS[usize::from(byte)];
    for (slot, sign) in acc.iter_mut().zip(signs) {
        *slot += f64::from_bits(bits ^ sign);
    }
}

/// The low byte of `h(i)` for the first [`CACHED_INDICES`] indices, computed once.
fn sign_bytes() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        #[allow(clippy::cast_possible_truncation)]
        (0..CACHED_INDICES as u64)
            .map(|i| element_hash(i) as u8)
            .collect()
    })
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
    fn tensors_beyond_the_cache_hash_their_indices() {
        let data: Vec<f32> = (0..CACHED_INDICES + 1000)
            .map(|i| ((i % 977) as f32 - 488.0) * 0.003)
            .collect();
        assert_eq!(Sketch::of(&data).0, reference(&data));
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
        let l2 = f64::from(crate::stats::TensorStats::from_slice(&forward).l2_norm);
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
        let l2 = f64::from(crate::stats::TensorStats::from_slice(&reference).l2_norm);
        let bound = Sketch::bound(reference.len(), l2, atol, rtol);
        let (a, b) = (Sketch::of(&reference), Sketch::of(&other));
        for (x, y) in a.0.iter().zip(&b.0) {
            assert!(f64::from((x - y).abs()) <= bound, "{x} {y} {bound}");
        }
        // and the first projection really is near the bound, so the bound is not slack
        assert!(f64::from((a.0[0] - b.0[0]).abs()) > 0.3 * bound);
    }
}
