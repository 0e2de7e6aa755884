//! The one-pass reduction behind [`TensorStats::from_slice`](super::TensorStats::from_slice).
//!
//! The data is cut into blocks of `W * TERMS_PER_LANE` elements. Inside a block, `W` independent
//! `f32` lanes accumulate `d = x - shift`, `d²`, `x²`, min and max: a handful of vector
//! instructions per group of elements and no branch. Each block is then folded into `f64` sums,
//! so the `f32` rounding error never grows beyond `TERMS_PER_LANE` additions.
//!
//! NaN and ±Inf need no test per element: any non-finite input makes its lane's sum of squares
//! non-finite, and so does a finite value whose square overflows `f32`. Only such blocks are
//! redone: counted, with their NaN and ±Inf made to count for nothing, through the same vector
//! pass (`Cleaned`; ~4x the cost of a finite block), and element by element in `f64` only if a
//! finite square overflowed (`Totals::add_exact`; values beyond 1.8e19, an explosion anyway).
//!
//! Squares of values below ~1e-19 underflow `f32`. When every finite value of the slice is below
//! 9.1e-13 (and not all are zero) the whole slice is summed again in `f64`
//! (`exact_if_tiny`): only such data can lose digits to underflow, since a larger value's square
//! dwarfs the lost ones.
//!
//! `shift` is a sample mean of the block, so that `Σ d²` stays small when the mean is large
//! compared to the spread (the classic loss of precision of `E[x²] - E[x]²`), also when the data
//! drifts from one block to the next. `Σ x²` (for the norm) is summed unshifted: a sum of
//! non-negative terms, precise whatever the shift, where deriving it from the shifted sums would
//! lose digits when an outlier pulls the shift away from the bulk of the block.
//!
//! This file holds the dispatch, the shared bookkeeping and the portable kernel; `x86.rs` the
//! AVX2 and AVX-512 ones.

use std::sync::atomic::{AtomicU8, Ordering};

/// Additions per lane before a block is folded into `f64`. Worst case, a lane's sum of squares
/// (non-negative terms) is then off by `(TERMS_PER_LANE + 3) * f32::EPSILON / 2` ≈ 1.1e-6
/// relative (up to three more roundings fold the lanes: AVX-512 halves its 16 lanes to 8
/// before widening to `f64`), so the norm, its square root, by half that; a few 1e-8 typically.
pub(super) const TERMS_PER_LANE: usize = 16;

/// Values sampled per block to choose its shift.
const SHIFT_SAMPLES: usize = 8;

/// Lane width of the portable kernel: two SSE2 / NEON registers per accumulator.
const PORTABLE_LANES: usize = 8;

/// Whether `f32::mul_add` is one instruction on the portable build target (otherwise it is a slow
/// libm call, and a separate multiply and add is used).
const PORTABLE_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// Which implementation of the reduction runs.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatsKernel {
    /// Plain Rust for the build target (SSE2 on x86_64).
    Portable,
    /// x86_64 with AVX2 and FMA: 16 lanes.
    Avx2,
    /// x86_64 with AVX-512F (and AVX2, FMA): 32 lanes.
    Avx512,
}

impl StatsKernel {
    /// Every kernel, slowest first.
    pub const ALL: [StatsKernel; 3] = [
        StatsKernel::Portable,
        StatsKernel::Avx2,
        StatsKernel::Avx512,
    ];

    /// The fastest kernel this CPU runs, detected on first use and cached.
    #[must_use]
    pub fn detected() -> StatsKernel {
        const UNKNOWN: u8 = u8::MAX;
        static DETECTED: AtomicU8 = AtomicU8::new(UNKNOWN);
        match DETECTED.load(Ordering::Relaxed) {
            0 => StatsKernel::Portable,
            1 => StatsKernel::Avx2,
            2 => StatsKernel::Avx512,
            _ => {
                let kernel = detect();
                DETECTED.store(kernel as u8, Ordering::Relaxed);
                kernel
            }
        }
    }

    /// Whether this CPU can run the kernel: each kernel's features include those of the
    /// slower ones, so every kernel up to the detected one runs.
    #[must_use]
    pub fn is_available(self) -> bool {
        self <= StatsKernel::detected()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> StatsKernel {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    if avx2 && is_x86_feature_detected!("avx512f") {
        StatsKernel::Avx512
    } else if avx2 {
        StatsKernel::Avx2
    } else {
        StatsKernel::Portable
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> StatsKernel {
    StatsKernel::Portable
}

/// Below this largest magnitude, squares of the data may fall into `f32`'s subnormal range
/// (below 1.2e-38), where they keep fewer than 24 bits: `2^-40` ≈ 9.1e-13, so that the sums of
/// squares of data at least this large are at least `2^-80` and the absolute rounding of squares
/// that do fall there (at most `2^-150` each) stays below `1e-6` relative up to `2^50` elements.
/// Deviations from the mean are multiples of an `ulp` no finer than `2^-64` for such data, so
/// their squares are exact even when subnormal.
const SMALLEST_FAST_MAGNITUDE: f32 = 1.0 / (1u64 << 40) as f32;

/// Reduces `data` with `kernel`, or `None` when this CPU cannot run it.
pub(super) fn reduce_with(data: &[f32], kernel: StatsKernel) -> Option<Totals> {
    reduce_in_f32_lanes(data, kernel).map(|totals| exact_if_tiny(totals, data))
}

/// Redoes the reduction in `f64` when every finite value is tiny but not all are zero (see
/// [`SMALLEST_FAST_MAGNITUDE`]): the `f32` squares would have underflowed, so `l2_norm` and
/// `std` would have lost digits or come out as zero. Costs one comparison otherwise.
fn exact_if_tiny(totals: Totals, data: &[f32]) -> Totals {
    // `min` is +Inf and `max` -Inf when there is no finite value: never tiny.
    let largest = totals.min.abs().max(totals.max.abs());
    if largest == 0.0 || largest >= SMALLEST_FAST_MAGNITUDE {
        return totals;
    }
    let mut exact = Totals::new(reference(data));
    exact.add_exact(data);
    exact
}

/// The vector reduction alone, `None` when this CPU cannot run `kernel`.
fn reduce_in_f32_lanes(data: &[f32], kernel: StatsKernel) -> Option<Totals> {
    if !kernel.is_available() {
        return None;
    }
    match kernel {
        StatsKernel::Portable => Some(portable_lanes(data)),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` checked that the CPU has AVX2 and FMA (`detect`).
        StatsKernel::Avx2 => Some(unsafe { super::x86::reduce_avx2(data) }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` checked that the CPU has AVX-512F, AVX2 and FMA (`detect`).
        StatsKernel::Avx512 => Some(unsafe { super::x86::reduce_avx512(data) }),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// Reduces `data` with the fastest kernel this CPU runs.
pub(super) fn reduce(data: &[f32]) -> Totals {
    reduce_with(data, StatsKernel::detected()).unwrap_or_else(|| reduce_portable(data))
}

/// Sums over the finite elements of a slice, in `f64`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Totals {
    pub finite: usize,
    pub nan: usize,
    pub inf: usize,
    /// Point the deviations are measured from: a sample mean of the data, so that
    /// `dev_sq - dev_sum² / n` does not cancel when the mean is large compared to the spread.
    pub reference: f64,
    /// Σ (x - reference)
    pub dev_sum: f64,
    /// Σ (x - reference)²
    pub dev_sq: f64,
    /// Σ x²
    pub sq: f64,
    /// Smallest finite value, `+Inf` while there is none.
    pub min: f32,
    /// Largest finite value, `-Inf` while there is none.
    pub max: f32,
}

impl Totals {
    pub(super) fn new(reference: f64) -> Self {
        Totals {
            finite: 0,
            nan: 0,
            inf: 0,
            reference,
            dev_sum: 0.0,
            dev_sq: 0.0,
            sq: 0.0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
        }
    }

    /// Adds a block element by element in `f64`: the path for blocks with finite values whose
    /// square overflows `f32` (|x| > 1.8e19), which an exploding model may produce but which are
    /// otherwise rare. NaN and ±Inf are taken out by [`Cleaned`] before that.
    ///
    /// Inlined into the (already out-of-line) retry paths so that it is compiled with their
    /// target features: SSE code called from AVX code runs several times slower.
    #[inline(always)]
    pub(super) fn add_exact(&mut self, block: &[f32]) {
        for &x in block {
            if x.is_nan() {
                self.nan += 1;
            } else if x.is_infinite() {
                self.inf += 1;
            } else {
                let v = f64::from(x);
                let dev = v - self.reference;
                self.finite += 1;
                self.dev_sum += dev;
                self.dev_sq += dev * dev;
                self.sq += v * v;
                self.min = self.min.min(x);
                self.max = self.max.max(x);
            }
        }
    }
}

/// The scalar side of folding finite blocks, shared by every kernel.
///
/// Block `b` has shift `c_b`, offset `o_b = c_b - reference`, `n_b` elements and lane sums `s_b`
/// of `d = x - c_b`, `q_b` of `d²` and `p_b` of `x²`. Then
/// `Σ (x - reference) = Σ s_b + Σ n_b o_b`,
/// `Σ (x - reference)² = Σ q_b + 2 Σ o_b s_b + Σ n_b o_b²` and `Σ x² = Σ p_b`.
/// The kernels keep `Σ s_b`, `Σ q_b`, `Σ p_b` and `Σ o_b s_b` in `f64` vector lanes (no
/// horizontal sum per block); the `n_b` terms are scalars, kept here.
pub(super) struct BlockBook {
    pub reference: f64,
    finite: usize,
    count_by_offset: f64,
    count_by_offset_sq: f64,
}

/// `[Σ s_b, Σ q_b, Σ p_b, Σ o_b s_b]` of [`BlockBook`].
pub(super) type LaneSums = [f64; 4];

impl BlockBook {
    pub(super) fn new(reference: f64) -> Self {
        BlockBook {
            reference,
            finite: 0,
            count_by_offset: 0.0,
            count_by_offset_sq: 0.0,
        }
    }

    /// Records a finite block of `len` elements with `shift`; returns its offset `o_b`.
    #[inline(always)]
    #[allow(clippy::cast_precision_loss)]
    pub(super) fn add_block(&mut self, len: usize, shift: f32) -> f64 {
        let offset = f64::from(shift) - self.reference;
        let n = len as f64;
        self.finite += len;
        self.count_by_offset += n * offset;
        self.count_by_offset_sq += n * offset * offset;
        offset
    }

    /// Adds the finite blocks to `totals`, given their lane sums, min and max.
    pub(super) fn finish(&self, lane_sums: LaneSums, min: f32, max: f32, totals: &mut Totals) {
        let [dev, dev_sq, sq, dev_by_offset] = lane_sums;
        totals.finite += self.finite;
        totals.dev_sum += dev + self.count_by_offset;
        totals.dev_sq += dev_sq + 2.0 * dev_by_offset + self.count_by_offset_sq;
        totals.sq += sq;
        if self.finite > 0 {
            totals.min = totals.min.min(min);
            totals.max = totals.max.max(max);
        }
    }
}

/// One block as the vector passes read it, three slices in lockstep: `values` for
/// `d = x - shift`, `squares` for `x²`, `extremes` for min and max. For a finite block all three
/// are the block; [`Cleaned`] and [`Padded`] make them differ so that some elements count for
/// nothing: `values` padded with `shift` (`d = 0`), `squares` with `0`, `extremes` with a
/// repeated element (no new min or max).
#[derive(Clone, Copy)]
pub(super) struct BlockView<'a> {
    pub values: &'a [f32],
    pub squares: &'a [f32],
    pub extremes: &'a [f32],
    pub shift: f32,
}

impl<'a> BlockView<'a> {
    #[inline(always)]
    pub(super) fn of(block: &'a [f32]) -> Self {
        BlockView {
            values: block,
            squares: block,
            extremes: block,
            shift: block_shift(block),
        }
    }

    /// The elements after the last full group of `width`.
    #[inline(always)]
    pub(super) fn rest(&self, width: usize) -> BlockView<'a> {
        let start = self.values.len() - self.values.len() % width;
        BlockView {
            values: &self.values[start..],
            squares: &self.squares[start..],
            extremes: &self.extremes[start..],
            shift: self.shift,
        }
    }
}

/// The last, partial group of a block as full-width arrays, padded as [`BlockView`] describes.
pub(super) struct Padded<const W: usize> {
    pub values: [f32; W],
    pub squares: [f32; W],
    pub extremes: [f32; W],
}

impl<const W: usize> Padded<W> {
    /// `None` when there is no partial group.
    #[inline(always)]
    pub(super) fn new(rest: BlockView<'_>) -> Option<Self> {
        let &repeated = rest.extremes.first()?;
        let len = rest.values.len();
        let mut padded = Padded {
            values: [rest.shift; W],
            squares: [0.0; W],
            extremes: [repeated; W],
        };
        padded.values[..len].copy_from_slice(rest.values);
        padded.squares[..len].copy_from_slice(rest.squares);
        padded.extremes[..len].copy_from_slice(rest.extremes);
        Some(padded)
    }
}

/// A block of at most `B` elements with its NaN and ±Inf made to count for nothing (as
/// [`BlockView`] describes), so that it goes through the same vector pass as finite blocks.
pub(super) struct Cleaned<const B: usize> {
    values: [f32; B],
    squares: [f32; B],
    extremes: [f32; B],
    len: usize,
    shift: f32,
    pub finite: usize,
    pub nan: usize,
    pub inf: usize,
}

impl<const B: usize> Cleaned<B> {
    /// Inlined so that it is compiled with the caller's target features: SSE code called from
    /// AVX code pays for the transition (measured up to 5x slower).
    #[inline(always)]
    pub(super) fn new(block: &[f32]) -> Self {
        let len = block.len().min(B);
        let block = &block[..len];
        let nan = block.iter().filter(|x| x.is_nan()).count();
        let inf = block.iter().filter(|x| x.is_infinite()).count();
        let fill = block.iter().copied().find(|x| x.is_finite()).unwrap_or(0.0);
        let mut cleaned = Cleaned {
            values: [0.0; B],
            squares: [0.0; B],
            extremes: [0.0; B],
            len,
            shift: 0.0,
            finite: len - nan - inf,
            nan,
            inf,
        };
        for (e, &x) in cleaned.extremes.iter_mut().zip(block) {
            *e = if x.is_finite() { x } else { fill };
        }
        cleaned.shift = block_shift(&cleaned.extremes[..len]);
        let shift = cleaned.shift;
        for (v, &x) in cleaned.values.iter_mut().zip(block) {
            *v = if x.is_finite() { x } else { shift };
        }
        for (s, &x) in cleaned.squares.iter_mut().zip(block) {
            *s = if x.is_finite() { x } else { 0.0 };
        }
        cleaned
    }

    #[inline(always)]
    pub(super) fn view(&self) -> BlockView<'_> {
        BlockView {
            values: &self.values[..self.len],
            squares: &self.squares[..self.len],
            extremes: &self.extremes[..self.len],
            shift: self.shift,
        }
    }
}

/// Mean of a few values spread over the block, in `f32` (the shift only needs to be near the
/// mean). Non-finite when a sample is, or when their sum overflows: the block then holds a NaN
/// or Inf, or values whose squares overflow too, and goes to the exact path anyway.
#[inline(always)]
pub(super) fn block_shift(block: &[f32]) -> f32 {
    const { assert!(SHIFT_SAMPLES == 8) };
    let step = block.len() / SHIFT_SAMPLES;
    let [a, b, c, d, e, f, g, h] = match block.get(7 * step) {
        // Then 0, step, ..., 7 * step are all in bounds.
        Some(_) if step > 0 => [0, 1, 2, 3, 4, 5, 6, 7].map(|k| block[k * step]),
        _ => return block.first().copied().unwrap_or(0.0),
    };
    (((a + b) + (c + d)) + ((e + f) + (g + h))) * 0.125
}

/// Mean of the finite values among the first few; the first finite value of the slice if there
/// are none there; `0.0` when there is no finite value at all.
#[allow(clippy::cast_precision_loss)]
pub(super) fn reference(data: &[f32]) -> f64 {
    let head = &data[..data.len().min(SHIFT_SAMPLES)];
    let (sum, n) = head
        .iter()
        .filter(|x| x.is_finite())
        .fold((0.0f64, 0usize), |(sum, n), &x| (sum + f64::from(x), n + 1));
    if n > 0 {
        return sum / n as f64;
    }
    data.iter()
        .find(|x| x.is_finite())
        .map_or(0.0, |&x| f64::from(x))
}

/// Reduces `data` with the portable kernel, whatever the CPU.
pub(super) fn reduce_portable(data: &[f32]) -> Totals {
    exact_if_tiny(portable_lanes(data), data)
}

/// The reduction in plain Rust: 8 lanes as two `F32x4` accumulators per quantity, which
/// compile to SSE2 / NEON registers.
fn portable_lanes(data: &[f32]) -> Totals {
    const BLOCK: usize = PORTABLE_LANES * TERMS_PER_LANE;
    let mut book = BlockBook::new(reference(data));
    let mut totals = Totals::new(book.reference);
    let mut sums = PortableSums::new();
    for block in data.chunks(BLOCK) {
        let view = BlockView::of(block);
        let pass = portable_pass(view);
        if pass.is_finite() {
            sums.add(&pass, book.add_block(block.len(), view.shift));
            continue;
        }
        let cleaned = Cleaned::<BLOCK>::new(block);
        if cleaned.finite > 0 {
            let pass = portable_pass(cleaned.view());
            if !pass.is_finite() {
                totals.add_exact(block);
                continue;
            }
            sums.add(&pass, book.add_block(cleaned.finite, cleaned.view().shift));
        }
        totals.nan += cleaned.nan;
        totals.inf += cleaned.inf;
    }
    book.finish(
        [
            sums.dev.total(),
            sums.dev_sq.total(),
            sums.sq.total(),
            sums.dev_by_offset.total(),
        ],
        sums.min.0.iter().fold(f32::INFINITY, |acc, &v| acc.min(v)),
        sums.max
            .0
            .iter()
            .fold(f32::NEG_INFINITY, |acc, &v| acc.max(v)),
        &mut totals,
    );
    totals
}

/// One block's lanes, folded to 4.
struct PortablePass {
    dev: F32x4,
    dev_sq: F32x4,
    sq: F32x4,
    min: F32x4,
    max: F32x4,
}

impl PortablePass {
    /// False when an element was NaN or ±Inf, or a square overflowed: those make their lane's
    /// sums of squares NaN or +Inf.
    #[inline(always)]
    fn is_finite(&self) -> bool {
        self.dev_sq.add(self.sq).all_finite()
    }
}

#[inline(always)]
fn portable_pass(view: BlockView<'_>) -> PortablePass {
    let c = F32x4::splat(view.shift);
    let mut lanes = [Lanes::new(); 2];
    let groups = view
        .values
        .chunks_exact(PORTABLE_LANES)
        .zip(view.squares.chunks_exact(PORTABLE_LANES))
        .zip(view.extremes.chunks_exact(PORTABLE_LANES));
    for ((values, squares), extremes) in groups {
        for (half, lanes) in lanes.iter_mut().enumerate() {
            let at = 4 * half;
            lanes.push::<PORTABLE_FMA>(
                F32x4::load(&values[at..]),
                F32x4::load(&squares[at..]),
                F32x4::load(&extremes[at..]),
                c,
            );
        }
    }
    if let Some(padded) = Padded::<PORTABLE_LANES>::new(view.rest(PORTABLE_LANES)) {
        for (half, lanes) in lanes.iter_mut().enumerate() {
            let at = 4 * half;
            lanes.push::<PORTABLE_FMA>(
                F32x4::load(&padded.values[at..]),
                F32x4::load(&padded.squares[at..]),
                F32x4::load(&padded.extremes[at..]),
                c,
            );
        }
    }
    let [a, b] = lanes;
    PortablePass {
        dev: a.dev.add(b.dev),
        dev_sq: a.dev_sq.add(b.dev_sq),
        sq: a.sq.add(b.sq),
        min: a.min.min(b.min),
        max: a.max.max(b.max),
    }
}

/// The `f64` sums and extremes of the finite blocks so far.
struct PortableSums {
    dev: F64x4,
    dev_sq: F64x4,
    sq: F64x4,
    dev_by_offset: F64x4,
    min: F32x4,
    max: F32x4,
}

impl PortableSums {
    fn new() -> Self {
        let zero = F64x4::splat(0.0);
        PortableSums {
            dev: zero,
            dev_sq: zero,
            sq: zero,
            dev_by_offset: zero,
            min: F32x4::splat(f32::INFINITY),
            max: F32x4::splat(f32::NEG_INFINITY),
        }
    }

    #[inline(always)]
    fn add(&mut self, pass: &PortablePass, offset: f64) {
        let dev = F64x4::from(pass.dev);
        self.dev = self.dev.add(dev);
        self.dev_sq = self.dev_sq.add(F64x4::from(pass.dev_sq));
        self.sq = self.sq.add(F64x4::from(pass.sq));
        self.dev_by_offset = self.dev_by_offset.add(F64x4::splat(offset).mul(dev));
        self.min = self.min.min(pass.min);
        self.max = self.max.max(pass.max);
    }
}

/// Accumulators of one block, for 4 lanes.
#[derive(Clone, Copy)]
struct Lanes {
    dev: F32x4,
    dev_sq: F32x4,
    sq: F32x4,
    min: F32x4,
    max: F32x4,
}

impl Lanes {
    #[inline(always)]
    fn new() -> Self {
        Lanes {
            dev: F32x4::splat(0.0),
            dev_sq: F32x4::splat(0.0),
            sq: F32x4::splat(0.0),
            min: F32x4::splat(f32::INFINITY),
            max: F32x4::splat(f32::NEG_INFINITY),
        }
    }

    /// Accumulates four elements, given three times (they differ only in a [`Padded`] group).
    #[inline(always)]
    fn push<const FMA: bool>(
        &mut self,
        values: F32x4,
        squares: F32x4,
        extremes: F32x4,
        shift: F32x4,
    ) {
        let d = values.sub(shift);
        self.dev = self.dev.add(d);
        if FMA {
            self.dev_sq = d.mul_add(d, self.dev_sq);
            self.sq = squares.mul_add(squares, self.sq);
        } else {
            self.dev_sq = self.dev_sq.add(d.mul(d));
            self.sq = self.sq.add(squares.mul(squares));
        }
        self.min = self.min.min(extremes);
        self.max = self.max.max(extremes);
    }
}

/// Four `f32` lanes; each operation is four identical scalar operations, which the compiler
/// emits as one SSE2 / NEON instruction.
#[derive(Clone, Copy)]
struct F32x4([f32; 4]);

impl F32x4 {
    #[inline(always)]
    fn splat(v: f32) -> Self {
        F32x4([v; 4])
    }

    /// The first four values of `values`, which has at least four.
    #[inline(always)]
    fn load(values: &[f32]) -> Self {
        let mut lanes = [0.0; 4];
        lanes.copy_from_slice(&values[..4]);
        F32x4(lanes)
    }

    #[inline(always)]
    fn zip(self, other: Self, op: impl Fn(f32, f32) -> f32) -> Self {
        let (a, b) = (self.0, other.0);
        F32x4([
            op(a[0], b[0]),
            op(a[1], b[1]),
            op(a[2], b[2]),
            op(a[3], b[3]),
        ])
    }

    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.zip(other, |a, b| a + b)
    }

    #[inline(always)]
    fn sub(self, other: Self) -> Self {
        self.zip(other, |a, b| a - b)
    }

    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self.zip(other, |a, b| a * b)
    }

    #[inline(always)]
    fn mul_add(self, other: Self, addend: Self) -> Self {
        let (a, b, c) = (self.0, other.0, addend.0);
        F32x4([
            a[0].mul_add(b[0], c[0]),
            a[1].mul_add(b[1], c[1]),
            a[2].mul_add(b[2], c[2]),
            a[3].mul_add(b[3], c[3]),
        ])
    }

    /// Compare-and-select is one `min` instruction; `f32::min` would add NaN handling, which
    /// finite blocks do not need and non-finite blocks redo exactly.
    #[inline(always)]
    fn min(self, other: Self) -> Self {
        self.zip(other, |a, b| if b < a { b } else { a })
    }

    #[inline(always)]
    fn max(self, other: Self) -> Self {
        self.zip(other, |a, b| if b > a { b } else { a })
    }

    #[inline(always)]
    fn all_finite(self) -> bool {
        self.0.iter().fold(true, |ok, &v| ok & v.is_finite())
    }
}

/// Four `f64` lanes.
#[derive(Clone, Copy)]
struct F64x4([f64; 4]);

impl F64x4 {
    #[inline(always)]
    fn splat(v: f64) -> Self {
        F64x4([v; 4])
    }

    #[inline(always)]
    fn from(v: F32x4) -> Self {
        F64x4(v.0.map(f64::from))
    }

    #[inline(always)]
    fn add(self, other: Self) -> Self {
        let (a, b) = (self.0, other.0);
        F64x4([a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]])
    }

    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        let (a, b) = (self.0, other.0);
        F64x4([a[0] * b[0], a[1] * b[1], a[2] * b[2], a[3] * b[3]])
    }

    #[inline(always)]
    fn total(self) -> f64 {
        let a = self.0;
        (a[0] + a[2]) + (a[1] + a[3])
    }
}
