//! candle's CUDA tensors, read on the device (feature `cuda`).
//!
//! A read queues a task in the pass's batch (`batch`): statistics reduced on the device into a
//! slot, or, for a tensor that needs a digest or is smaller than
//! [`SummaryRequest::copy_below`], its values gathered (views included, in row-major order and
//! their own dtype) to be summarised on the host exactly as a CPU tensor is. The batch runs its
//! tasks with one kernel launch (`kernel`, `stats.cu`) and copies the results back once, when the
//! pass ends: nothing waits for the device before that, and a read costs the host 1.45 µs (an
//! H100 machine, session bookkeeping included).
//!
//! Reads of dtypes other than f32, f64, f16 and bf16 are not deferred: they take the host copy
//! of [`TraceTensor::with_f32`](crate::TraceTensor::with_f32).

mod batch;
mod kernel;
mod layout;
mod values;

use candle_core::{DType, Storage, Tensor};

use self::batch::batch_of;
use self::kernel::SLOT_WORDS;
use self::layout::DeviceLayout;
use super::{PendingSummary, SummaryRequest, TensorError};
use crate::stats::{FiniteMoments, TensorStats};
use crate::summary::TensorSummary;

/// Starts reading `tensor` (on a CUDA device); `None` when it is read now instead.
pub(super) fn start_summary(
    tensor: &Tensor,
    request: &SummaryRequest,
) -> Option<Result<PendingSummary, TensorError>> {
    let dtype = tensor.dtype();
    if !matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
        || tensor.elem_count() == 0
    {
        return None;
    }
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return None;
    };
    let device_layout = DeviceLayout::new(layout.start_offset(), layout.dims(), layout.stride())?;
    let batch = match batch_of(&cuda.device) {
        Ok(batch) => batch,
        Err(error) => return Some(Err(error)),
    };
    let count = device_layout.count;
    if request.digest || count < request.copy_below {
        let digest = request.digest;
        let started = batch
            .borrow_mut()
            .start_gather(tensor, &cuda.slice, &device_layout, digest);
        let (number, index) = match started {
            Ok(started) => started,
            Err(error) => return Some(Err(error)),
        };
        return Some(Ok(PendingSummary::new(move || {
            batch.borrow_mut().gathered(number, index)
        })));
    }
    let started = batch
        .borrow_mut()
        .start_stats(tensor, &cuda.slice, &device_layout)?;
    let (number, at) = match started {
        Ok(started) => started,
        Err(error) => return Some(Err(error)),
    };
    let shape = tensor.dims().to_vec();
    Some(Ok(PendingSummary::new(move || {
        let slot = batch.borrow_mut().slot(number, at)?;
        Ok(TensorSummary::from_stats(
            shape,
            dtype.as_str(),
            stats_of_slot(&slot, count),
        ))
    })))
}

/// The statistics of a slot the kernel filled, for a tensor of `count` elements.
fn stats_of_slot(slot: &[u64; SLOT_WORDS], count: usize) -> TensorStats {
    let to_usize = |word: u64| usize::try_from(word).unwrap_or(usize::MAX);
    let extremes = slot[5];
    #[allow(clippy::cast_possible_truncation)]
    let (max_key, min_key) = (extremes as u32, !((extremes >> 32) as u32));
    let moments = FiniteMoments {
        count,
        nan_count: to_usize(slot[0]),
        inf_count: to_usize(slot[1]),
        shift: f64::from_bits(slot[6]),
        sum: f64::from_bits(slot[3]),
        sum_sq: f64::from_bits(slot[4]),
        min: float_of_key(min_key),
        max: float_of_key(max_key),
    };
    TensorStats::from_moments(&moments)
}

/// The float that `key()` of stats.cu maps to `key` (the order-preserving map is its own
/// inverse up to the sign bit).
fn float_of_key(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `key()` of stats.cu.
    fn key(value: f32) -> u32 {
        let bits = value.to_bits();
        if bits & 0x8000_0000 != 0 {
            !bits
        } else {
            bits | 0x8000_0000
        }
    }

    #[test]
    fn keys_keep_the_order_of_finite_floats_and_never_are_zero() {
        let values = [
            -f32::MAX,
            -1.5,
            -f32::MIN_POSITIVE,
            -1e-45,
            -0.0,
            0.0,
            1e-45,
            2.0,
            f32::MAX,
        ];
        for pair in values.windows(2) {
            assert!(key(pair[0]) <= key(pair[1]), "{pair:?}");
        }
        for value in values {
            assert_eq!(float_of_key(key(value)).to_bits(), value.to_bits());
            assert_ne!(key(value), 0);
            assert_ne!(!key(value), 0);
        }
    }

    #[test]
    fn a_slot_decodes_to_the_statistics_of_its_sums() {
        let values = [3.0f32, 5.0, f32::NAN, f32::NEG_INFINITY, 4.0];
        let shift = 3.0f64;
        let finite = [3.0f64, 5.0, 4.0];
        let slot = [
            1,
            1,
            3,
            finite.iter().map(|x| x - shift).sum::<f64>().to_bits(),
            finite
                .iter()
                .map(|x| (x - shift).powi(2))
                .sum::<f64>()
                .to_bits(),
            u64::from(key(5.0)) | (u64::from(!key(3.0)) << 32),
            shift.to_bits(),
            0,
        ];
        let stats = stats_of_slot(&slot, values.len());
        let host = TensorStats::from_slice(&values);
        assert_eq!(stats, host);
    }
}
