//! A device tensor's values copied to the host, in its own dtype, widened to `f32` as candle's
//! `to_dtype(F32)` does on the CPU (every value exactly; NaN payloads aside, which fingerprints
//! and captures canonicalise anyway).

use std::sync::OnceLock;

use candle_core::DType;
use rayon::prelude::*;

use crate::stats::TensorStats;
use crate::summary::TensorSummary;
use crate::tensor::TensorError;

/// Below this many bytes in all, a batch's gathered tensors are summarised on the calling
/// thread: handing them to other threads would cost more than it saves.
const PARALLEL_MIN_BYTES: usize = 128 << 10;

/// Threads that summarise a batch's gathered tensors at most (the calling one among them).
const MAX_THREADS: usize = 4;

/// A tensor's values as they came back from the device, and what its read asked for.
pub(super) struct Gathered<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) dtype: DType,
    pub(super) shape: &'a [usize],
    /// A digest besides the statistics.
    pub(super) digest: bool,
}

impl Gathered<'_> {
    fn summarise(&self) -> Result<TensorSummary, TensorError> {
        let values = widen(self.bytes, self.dtype)?;
        let (shape, name) = (self.shape.to_vec(), self.dtype.as_str());
        Ok(if self.digest {
            TensorSummary::of_values(shape, name, &values)
        } else {
            TensorSummary::from_stats(shape, name, TensorStats::from_slice(&values))
        })
    }
}

/// The summaries of a batch's gathered tensors, in order. A digest costs the host ~2.4 µs for
/// 576 values (most of it the BLAKE3 fingerprint; one core of the development machine), ~0.5 ms
/// for a SmolLM2 decode step's 210 tensors, a sixth of the step on an H100: large batches are
/// shared among a few threads of a pool of model-trace's own, started on first use.
pub(super) fn summarise(reads: &[Gathered<'_>]) -> Vec<Result<TensorSummary, TensorError>> {
    summarise_on(pool(), reads)
}

fn summarise_on(
    pool: Option<&rayon::ThreadPool>,
    reads: &[Gathered<'_>],
) -> Vec<Result<TensorSummary, TensorError>> {
    let bytes: usize = reads.iter().map(|read| read.bytes.len()).sum();
    match pool {
        Some(pool) if bytes >= PARALLEL_MIN_BYTES && reads.len() > 1 => {
            pool.install(|| reads.par_iter().map(Gathered::summarise).collect())
        }
        _ => reads.iter().map(Gathered::summarise).collect(),
    }
}

/// The summarising threads: half the machine's cores, at most [`MAX_THREADS`]; `None` on a
/// machine of one or two cores (or when the pool cannot start), where the calling thread does
/// it all.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let threads = (cores / 2).min(MAX_THREADS);
        (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|at| format!("model-trace-digest-{at}"))
                    .build()
                    .ok()
            })
            .flatten()
    })
    .as_ref()
}

/// The `f32` values of little-endian `bytes` of `dtype`.
pub(super) fn widen(bytes: &[u8], dtype: DType) -> Result<Vec<f32>, TensorError> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        #[allow(clippy::cast_possible_truncation)]
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| widen_f16(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        other => {
            return Err(TensorError::Backend(format!(
                "no device copy of {} values",
                other.as_str()
            )))
        }
    })
}

/// An IEEE half's value as `f32` (exact), the way `widen_f16` of stats.cu computes it.
fn widen_f16(half: u16) -> f32 {
    let bits = u32::from(half);
    let sign = (bits & 0x8000) << 16;
    let exponent = (bits >> 10) & 0x1f;
    let mantissa = bits & 0x3ff;
    match exponent {
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mantissa << 13)),
        0 => {
            #[allow(clippy::cast_precision_loss)]
            let magnitude = mantissa as f32 * 5.960_464_5e-8;
            if sign != 0 {
                -magnitude
            } else {
                magnitude
            }
        }
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 and bf16 bit pattern widens to what candle's CPU conversion (the `half` crate)
    /// gives, NaN to a NaN.
    #[test]
    fn every_half_widens_as_candle_widens_it() {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let f16 = widen(&bytes, DType::F16).unwrap();
        let bf16 = widen(&bytes, DType::BF16).unwrap();
        for (at, &b) in bits.iter().enumerate() {
            let cases = [
                (f16[at], half::f16::from_bits(b).to_f32(), "f16"),
                (bf16[at], half::bf16::from_bits(b).to_f32(), "bf16"),
            ];
            for (ours, theirs, dtype) in cases {
                if theirs.is_nan() {
                    assert!(ours.is_nan(), "{dtype} {b:#06x}");
                } else {
                    assert_eq!(ours.to_bits(), theirs.to_bits(), "{dtype} {b:#06x}");
                }
            }
        }
    }

    /// Summaries are those of each tensor alone, in order, whether the batch is large enough
    /// to be shared among threads or not.
    #[test]
    fn summaries_of_a_batch_are_each_tensors_own() {
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for (tensors, len, pool) in [
            (3, 10, Some(&threads)),
            (200, 1000, Some(&threads)),
            (200, 1000, None),
        ] {
            let values: Vec<Vec<f32>> = (0..tensors)
                .map(|t| {
                    (0..len)
                        .map(|i| ((i * 31 + t * 7) % 97) as f32 - 40.0)
                        .collect()
                })
                .collect();
            let bytes: Vec<Vec<u8>> = values
                .iter()
                .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
                .collect();
            let shape = [len];
            let reads: Vec<Gathered<'_>> = bytes
                .iter()
                .enumerate()
                .map(|(at, bytes)| Gathered {
                    bytes,
                    dtype: DType::F32,
                    shape: &shape,
                    digest: at % 2 == 0,
                })
                .collect();
            let summaries = summarise_on(pool, &reads);
            assert_eq!(summaries.len(), tensors);
            for (at, summary) in summaries.into_iter().enumerate() {
                let summary = summary.unwrap();
                let expected = if at % 2 == 0 {
                    TensorSummary::of_values(vec![len], "f32", &values[at])
                } else {
                    TensorSummary::from_stats(
                        vec![len],
                        "f32",
                        TensorStats::from_slice(&values[at]),
                    )
                };
                assert_eq!(summary, expected, "{tensors} tensors, #{at}");
            }
        }
    }

    #[test]
    fn wider_floats_are_read_as_they_are() {
        let values = [1.5f64, -0.0, f64::INFINITY, 1e300];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let widened = widen(&bytes, DType::F64).unwrap();
        assert_eq!(widened[..3], [1.5, -0.0, f32::INFINITY]);
        assert_eq!(widened[3], f32::INFINITY);
        assert!(widen(&[0, 1], DType::U8).is_err());
    }
}
