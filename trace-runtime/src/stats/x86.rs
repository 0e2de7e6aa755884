//! AVX2 and AVX-512 versions of the block reduction of `kernel.rs`, written with intrinsics.
//!
//! The auto-vectorizer turned the portable code into clean AVX-512 in some builds and into
//! shuffles and spills in others (it depends on what it can prove about the block length), so
//! the hot loops are spelled out here: per register of elements one subtract, one add, two FMAs,
//! one min and one max, with two independent accumulators per quantity to hide the latency.
//! Blocks, shifts, NaN/Inf handling and the final sums are shared with the portable kernel
//! (`BlockView`, `Cleaned`, `BlockBook`).
//!
//! The two entry points are `unsafe fn`: their one obligation is the CPU feature, which
//! `StatsKernel::detected` checks (the AVX-512 kernel also uses AVX2 and FMA, for its 8-lane
//! folds; AVX-512F implies both on every CPU that has it, and detection checks them anyway). The
//! loads and stores are the only other unsafe operations; each has its SAFETY note. The helpers
//! are safe `#[target_feature]` functions, callable only from code with the same features.
//!
//! The AVX-512 kernel keeps two registers of 16 lanes per quantity (blocks of 512 elements).
//! On data in L1/L2 it runs ~1.5x faster than AVX2; from L3 or memory the two are equal, the
//! loads being the limit.

use std::arch::x86_64::*;

use super::kernel::{reference, BlockBook, BlockView, Cleaned, Padded, Totals, TERMS_PER_LANE};

/// f32 lanes per block accumulator of the AVX-512 kernel: two registers of 16.
const LANES_512: usize = 32;
const BLOCK_512: usize = LANES_512 * TERMS_PER_LANE;
/// f32 lanes per block accumulator of the AVX2 kernel: two registers of 8.
const LANES_256: usize = 16;
const BLOCK_256: usize = LANES_256 * TERMS_PER_LANE;

/// The pass functions are generic over where they are called from only so that the hot loop's
/// copy has a single call site and is inlined (a call per block costs ~1.5x on 4K elements);
/// `#[inline(always)]` is not allowed with `#[target_feature]`.
const HOT: bool = false;
const COLD: bool = true;

/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn reduce_avx512(data: &[f32]) -> Totals {
    let mut book = BlockBook::new(reference(data));
    let mut totals = Totals::new(book.reference);
    let mut sums = Sums512::new();
    for block in data.chunks(BLOCK_512) {
        let view = BlockView::of(block);
        let pass = pass_512::<HOT>(view);
        if all_finite(_mm256_add_ps(pass.dev_sq, pass.sq)) {
            sums.add(&pass, book.add_block(block.len(), view.shift));
        } else {
            retry_512(block, &mut sums, &mut book, &mut totals);
        }
    }
    book.finish(
        [
            _mm512_reduce_add_pd(sums.dev),
            _mm512_reduce_add_pd(sums.dev_sq),
            _mm512_reduce_add_pd(sums.sq),
            _mm512_reduce_add_pd(sums.dev_by_offset),
        ],
        _mm512_reduce_min_ps(sums.min),
        _mm512_reduce_max_ps(sums.max),
        &mut totals,
    );
    totals
}

/// A block whose fast pass saw a NaN, ±Inf or an overflowing square: its NaN and ±Inf taken
/// out, it goes through the vector pass again; only finite values whose square overflows `f32`
/// leave for the exact scalar path.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
fn retry_512(block: &[f32], sums: &mut Sums512, book: &mut BlockBook, totals: &mut Totals) {
    let cleaned = Cleaned::<BLOCK_512>::new(block);
    if cleaned.finite > 0 {
        let view = cleaned.view();
        let pass = pass_512::<COLD>(view);
        if !all_finite(_mm256_add_ps(pass.dev_sq, pass.sq)) {
            totals.add_exact(block);
            return;
        }
        sums.add(&pass, book.add_block(cleaned.finite, view.shift));
    }
    totals.nan += cleaned.nan;
    totals.inf += cleaned.inf;
}

/// One block's lane sums, folded to 8 lanes, and its 16 lanes of min and max.
struct Pass512 {
    dev: __m256,
    dev_sq: __m256,
    sq: __m256,
    min: __m512,
    max: __m512,
}

#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn pass_512<const FOR_RETRY: bool>(view: BlockView<'_>) -> Pass512 {
    let c = _mm512_set1_ps(view.shift);
    let zero = _mm512_setzero_ps();
    let (mut d0, mut d1, mut q0, mut q1, mut p0, mut p1) = (zero, zero, zero, zero, zero, zero);
    let (mut lo0, mut lo1) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(f32::INFINITY));
    let (mut hi0, mut hi1) = (
        _mm512_set1_ps(f32::NEG_INFINITY),
        _mm512_set1_ps(f32::NEG_INFINITY),
    );
    // One register of elements from each of the three views.
    macro_rules! push {
        ($values:expr, $squares:expr, $extremes:expr, $d:ident, $q:ident, $p:ident, $lo:ident, $hi:ident) => {{
            let d = _mm512_sub_ps($values, c);
            $d = _mm512_add_ps($d, d);
            $q = _mm512_fmadd_ps(d, d, $q);
            $p = _mm512_fmadd_ps($squares, $squares, $p);
            $lo = _mm512_min_ps($lo, $extremes);
            $hi = _mm512_max_ps($hi, $extremes);
        }};
    }
    // Loads elements 0..16 and 16..32 of three slices of (at least) LANES_512 = 32 floats.
    macro_rules! load_group {
        ($values:expr, $squares:expr, $extremes:expr) => {{
            let (v, s, e): (&[f32], &[f32], &[f32]) = ($values, $squares, $extremes);
            debug_assert!(v.len() >= LANES_512 && s.len() >= LANES_512 && e.len() >= LANES_512);
            // SAFETY: each slice holds at least LANES_512 = 32 floats.
            unsafe {
                (
                    (
                        _mm512_loadu_ps(v.as_ptr()),
                        _mm512_loadu_ps(v.as_ptr().add(16)),
                    ),
                    (
                        _mm512_loadu_ps(s.as_ptr()),
                        _mm512_loadu_ps(s.as_ptr().add(16)),
                    ),
                    (
                        _mm512_loadu_ps(e.as_ptr()),
                        _mm512_loadu_ps(e.as_ptr().add(16)),
                    ),
                )
            }
        }};
    }
    let groups = view
        .values
        .chunks_exact(LANES_512)
        .zip(view.squares.chunks_exact(LANES_512))
        .zip(view.extremes.chunks_exact(LANES_512));
    for ((values, squares), extremes) in groups {
        let ((v0, v1), (s0, s1), (e0, e1)) = load_group!(values, squares, extremes);
        push!(v0, s0, e0, d0, q0, p0, lo0, hi0);
        push!(v1, s1, e1, d1, q1, p1, lo1, hi1);
    }
    if let Some(padded) = Padded::<LANES_512>::new(view.rest(LANES_512)) {
        let ((v0, v1), (s0, s1), (e0, e1)) =
            load_group!(&padded.values, &padded.squares, &padded.extremes);
        push!(v0, s0, e0, d0, q0, p0, lo0, hi0);
        push!(v1, s1, e1, d1, q1, p1, lo1, hi1);
    }
    Pass512 {
        dev: halves_sum(_mm512_add_ps(d0, d1)),
        dev_sq: halves_sum(_mm512_add_ps(q0, q1)),
        sq: halves_sum(_mm512_add_ps(p0, p1)),
        min: _mm512_min_ps(lo0, lo1),
        max: _mm512_max_ps(hi0, hi1),
    }
}

/// Adds the two 8-lane halves of a 16-lane register (one more `f32` rounding, and one
/// conversion to `f64` instead of two).
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn halves_sum(v: __m512) -> __m256 {
    let low = _mm512_castps512_ps256(v);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(low, high)
}

/// The `f64` sums and extremes of the finite blocks so far.
struct Sums512 {
    dev: __m512d,
    dev_sq: __m512d,
    sq: __m512d,
    dev_by_offset: __m512d,
    min: __m512,
    max: __m512,
}

impl Sums512 {
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn new() -> Self {
        Sums512 {
            dev: _mm512_setzero_pd(),
            dev_sq: _mm512_setzero_pd(),
            sq: _mm512_setzero_pd(),
            dev_by_offset: _mm512_setzero_pd(),
            min: _mm512_set1_ps(f32::INFINITY),
            max: _mm512_set1_ps(f32::NEG_INFINITY),
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn add(&mut self, pass: &Pass512, offset: f64) {
        let dev = _mm512_cvtps_pd(pass.dev);
        self.dev = _mm512_add_pd(self.dev, dev);
        self.dev_sq = _mm512_add_pd(self.dev_sq, _mm512_cvtps_pd(pass.dev_sq));
        self.sq = _mm512_add_pd(self.sq, _mm512_cvtps_pd(pass.sq));
        self.dev_by_offset = _mm512_fmadd_pd(_mm512_set1_pd(offset), dev, self.dev_by_offset);
        self.min = _mm512_min_ps(self.min, pass.min);
        self.max = _mm512_max_ps(self.max, pass.max);
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn reduce_avx2(data: &[f32]) -> Totals {
    let mut book = BlockBook::new(reference(data));
    let mut totals = Totals::new(book.reference);
    let mut sums = Sums256::new();
    for block in data.chunks(BLOCK_256) {
        let view = BlockView::of(block);
        let pass = pass_256::<HOT>(view);
        if all_finite(_mm256_add_ps(pass.dev_sq, pass.sq)) {
            sums.add(&pass, book.add_block(block.len(), view.shift));
        } else {
            retry_256(block, &mut sums, &mut book, &mut totals);
        }
    }
    let mut mins = [0.0f32; 8];
    let mut maxs = [0.0f32; 8];
    // SAFETY: each array holds 8 floats, one 256-bit register.
    unsafe {
        _mm256_storeu_ps(mins.as_mut_ptr(), sums.min);
        _mm256_storeu_ps(maxs.as_mut_ptr(), sums.max);
    }
    book.finish(
        [
            total(sums.dev),
            total(sums.dev_sq),
            total(sums.sq),
            total(sums.dev_by_offset),
        ],
        mins.iter().fold(f32::INFINITY, |acc, &v| acc.min(v)),
        maxs.iter().fold(f32::NEG_INFINITY, |acc, &v| acc.max(v)),
        &mut totals,
    );
    totals
}

/// A block whose fast pass saw a NaN, ±Inf or an overflowing square: its NaN and ±Inf taken
/// out, it goes through the vector pass again; only finite values whose square overflows `f32`
/// leave for the exact scalar path.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
fn retry_256(block: &[f32], sums: &mut Sums256, book: &mut BlockBook, totals: &mut Totals) {
    let cleaned = Cleaned::<BLOCK_256>::new(block);
    if cleaned.finite > 0 {
        let view = cleaned.view();
        let pass = pass_256::<COLD>(view);
        if !all_finite(_mm256_add_ps(pass.dev_sq, pass.sq)) {
            totals.add_exact(block);
            return;
        }
        sums.add(&pass, book.add_block(cleaned.finite, view.shift));
    }
    totals.nan += cleaned.nan;
    totals.inf += cleaned.inf;
}

/// One block's lane sums, folded to 8 lanes, and its 8 lanes of min and max.
struct Pass256 {
    dev: __m256,
    dev_sq: __m256,
    sq: __m256,
    min: __m256,
    max: __m256,
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn pass_256<const FOR_RETRY: bool>(view: BlockView<'_>) -> Pass256 {
    let c = _mm256_set1_ps(view.shift);
    let zero = _mm256_setzero_ps();
    let (mut d0, mut d1, mut q0, mut q1, mut p0, mut p1) = (zero, zero, zero, zero, zero, zero);
    let (mut lo0, mut lo1) = (_mm256_set1_ps(f32::INFINITY), _mm256_set1_ps(f32::INFINITY));
    let (mut hi0, mut hi1) = (
        _mm256_set1_ps(f32::NEG_INFINITY),
        _mm256_set1_ps(f32::NEG_INFINITY),
    );
    // One register of elements from each of the three views.
    macro_rules! push {
        ($values:expr, $squares:expr, $extremes:expr, $d:ident, $q:ident, $p:ident, $lo:ident, $hi:ident) => {{
            let d = _mm256_sub_ps($values, c);
            $d = _mm256_add_ps($d, d);
            $q = _mm256_fmadd_ps(d, d, $q);
            $p = _mm256_fmadd_ps($squares, $squares, $p);
            $lo = _mm256_min_ps($lo, $extremes);
            $hi = _mm256_max_ps($hi, $extremes);
        }};
    }
    // Loads elements 0..8 and 8..16 of three slices of (at least) LANES_256 = 16 floats.
    macro_rules! load_group {
        ($values:expr, $squares:expr, $extremes:expr) => {{
            let (v, s, e): (&[f32], &[f32], &[f32]) = ($values, $squares, $extremes);
            debug_assert!(v.len() >= LANES_256 && s.len() >= LANES_256 && e.len() >= LANES_256);
            // SAFETY: each slice holds at least LANES_256 = 16 floats.
            unsafe {
                (
                    (
                        _mm256_loadu_ps(v.as_ptr()),
                        _mm256_loadu_ps(v.as_ptr().add(8)),
                    ),
                    (
                        _mm256_loadu_ps(s.as_ptr()),
                        _mm256_loadu_ps(s.as_ptr().add(8)),
                    ),
                    (
                        _mm256_loadu_ps(e.as_ptr()),
                        _mm256_loadu_ps(e.as_ptr().add(8)),
                    ),
                )
            }
        }};
    }
    let groups = view
        .values
        .chunks_exact(LANES_256)
        .zip(view.squares.chunks_exact(LANES_256))
        .zip(view.extremes.chunks_exact(LANES_256));
    for ((values, squares), extremes) in groups {
        let ((v0, v1), (s0, s1), (e0, e1)) = load_group!(values, squares, extremes);
        push!(v0, s0, e0, d0, q0, p0, lo0, hi0);
        push!(v1, s1, e1, d1, q1, p1, lo1, hi1);
    }
    if let Some(padded) = Padded::<LANES_256>::new(view.rest(LANES_256)) {
        let ((v0, v1), (s0, s1), (e0, e1)) =
            load_group!(&padded.values, &padded.squares, &padded.extremes);
        push!(v0, s0, e0, d0, q0, p0, lo0, hi0);
        push!(v1, s1, e1, d1, q1, p1, lo1, hi1);
    }
    Pass256 {
        dev: _mm256_add_ps(d0, d1),
        dev_sq: _mm256_add_ps(q0, q1),
        sq: _mm256_add_ps(p0, p1),
        min: _mm256_min_ps(lo0, lo1),
        max: _mm256_max_ps(hi0, hi1),
    }
}

/// The `f64` sums (as low and high 4 lanes) and extremes of the finite blocks so far.
struct Sums256 {
    dev: (__m256d, __m256d),
    dev_sq: (__m256d, __m256d),
    sq: (__m256d, __m256d),
    dev_by_offset: (__m256d, __m256d),
    min: __m256,
    max: __m256,
}

impl Sums256 {
    #[target_feature(enable = "avx2")]
    #[inline]
    fn new() -> Self {
        let zero = (_mm256_setzero_pd(), _mm256_setzero_pd());
        Sums256 {
            dev: zero,
            dev_sq: zero,
            sq: zero,
            dev_by_offset: zero,
            min: _mm256_set1_ps(f32::INFINITY),
            max: _mm256_set1_ps(f32::NEG_INFINITY),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn add(&mut self, pass: &Pass256, offset: f64) {
        let dev = widen(pass.dev);
        self.dev = add_pairs(self.dev, dev);
        self.dev_sq = add_pairs(self.dev_sq, widen(pass.dev_sq));
        self.sq = add_pairs(self.sq, widen(pass.sq));
        let offset = _mm256_set1_pd(offset);
        self.dev_by_offset = (
            _mm256_fmadd_pd(offset, dev.0, self.dev_by_offset.0),
            _mm256_fmadd_pd(offset, dev.1, self.dev_by_offset.1),
        );
        self.min = _mm256_min_ps(self.min, pass.min);
        self.max = _mm256_max_ps(self.max, pass.max);
    }
}

/// The 8 lanes of `v` as two registers of 4 `f64`.
#[target_feature(enable = "avx2")]
#[inline]
fn widen(v: __m256) -> (__m256d, __m256d) {
    (
        _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
    )
}

#[target_feature(enable = "avx2")]
#[inline]
fn add_pairs(a: (__m256d, __m256d), b: (__m256d, __m256d)) -> (__m256d, __m256d) {
    (_mm256_add_pd(a.0, b.0), _mm256_add_pd(a.1, b.1))
}

/// Sum of the 8 `f64` lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn total(v: (__m256d, __m256d)) -> f64 {
    let quad = _mm256_add_pd(v.0, v.1);
    let pair = _mm_add_pd(
        _mm256_castpd256_pd128(quad),
        _mm256_extractf128_pd::<1>(quad),
    );
    _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)))
}

/// True when no lane is NaN or ±Inf. A NaN or ±Inf element, or a square that overflows `f32`,
/// makes its lane's sums of squares NaN or +Inf, and the folds keep them so.
#[target_feature(enable = "avx2")]
#[inline]
fn all_finite(sums_of_squares: __m256) -> bool {
    let below_inf = _mm256_cmp_ps::<_CMP_LT_OQ>(sums_of_squares, _mm256_set1_ps(f32::INFINITY));
    _mm256_movemask_ps(below_inf) == 0xFF
}
