//! candle's CUDA tensors, read on the device (feature `cuda`).
//!
//! Statistics come from one kernel launch per tensor (`stats.cu`), reading the tensor in place
//! in its own dtype and layout, into a slot of the pass's batch. A tensor that needs a digest, or
//! is smaller than [`SummaryRequest::copy_below`], is instead copied whole into pinned host memory
//! (asynchronously; a view is made contiguous on the device first) and summarised on the host
//! exactly as a CPU tensor is. Either way nothing waits for the device until the pass ends: its
//! first finished read copies the batch's slots back and waits for the stream, once.
//!
//! Reads of dtypes other than f32, f64, f16 and bf16 are not deferred: they take the host copy
//! of [`TraceTensor::with_f32`](crate::TraceTensor::with_f32).

mod batch;
mod kernel;
mod layout;
mod values;

use std::borrow::Cow;

use candle_core::{DType, Storage, Tensor};

use self::batch::{batch_of, ReadBack};
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
    let copy = request.digest || tensor.elem_count() < request.copy_below;
    let started = if copy {
        start_copy(tensor, request.digest)
    } else {
        start_stats(tensor)?
    };
    Some(started)
}

/// Queues the statistics kernel; `None` for a layout of more dimensions than it takes.
fn start_stats(tensor: &Tensor) -> Option<Result<PendingSummary, TensorError>> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return None;
    };
    let device_layout = DeviceLayout::new(layout.start_offset(), layout.dims(), layout.stride())?;
    let batch = match batch_of(&cuda.device) {
        Ok(batch) => batch,
        Err(error) => return Some(Err(error)),
    };
    let started = batch
        .borrow_mut()
        .start_stats(&cuda.slice, &device_layout)?;
    let (number, place) = match started {
        Ok(started) => started,
        Err(error) => return Some(Err(error)),
    };
    let shape = tensor.dims().to_vec();
    let dtype = tensor.dtype().as_str();
    let count = device_layout.count;
    Some(Ok(PendingSummary::new(move || {
        let mut batch = batch.borrow_mut();
        let ReadBack::Slot(slot) = batch.result(number, place)? else {
            return Err(TensorError::Backend(
                "a statistics read got values".to_owned(),
            ));
        };
        Ok(TensorSummary::from_stats(
            shape,
            dtype,
            stats_of_slot(&slot, count),
        ))
    })))
}

/// Queues a copy of the values to pinned host memory, to be summarised there.
fn start_copy(tensor: &Tensor, digest: bool) -> Result<PendingSummary, TensorError> {
    // A view is copied into a contiguous tensor on the device first (one kernel): a digest needs
    // the values in row-major order.
    let tensor: Cow<'_, Tensor> = if tensor.is_contiguous() {
        Cow::Borrowed(tensor)
    } else {
        Cow::Owned(tensor.contiguous()?)
    };
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(TensorError::Backend("not a CUDA tensor".to_owned()));
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(TensorError::Backend(
            "a contiguous tensor has no contiguous offsets".into(),
        ));
    };
    let batch = batch_of(&cuda.device)?;
    let (number, place) = batch.borrow_mut().start_copy(&cuda.slice, start..end)?;
    let shape = tensor.dims().to_vec();
    let dtype = tensor.dtype();
    Ok(PendingSummary::new(move || {
        let mut batch = batch.borrow_mut();
        let ReadBack::Bytes(bytes) = batch.result(number, place)? else {
            return Err(TensorError::Backend(
                "a copy read got statistics".to_owned(),
            ));
        };
        let values = values::widen(bytes, dtype)?;
        let name = dtype.as_str();
        Ok(if digest {
            TensorSummary::of_values(shape, name, &values)
        } else {
            TensorSummary::from_stats(shape, name, TensorStats::from_slice(&values))
        })
    }))
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
