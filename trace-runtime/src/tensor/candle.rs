//! `candle_core::Tensor` as a [`TraceTensor`]: every dtype, every device.
//!
//! On the CPU an `f32` contiguous tensor is read in place, under candle's storage lock.
//! On another device the statistics are reduced there and only a handful of scalars come back:
//! copying the activations to the host would force a synchronisation and a transfer per
//! tracepoint.

use std::borrow::Cow;

use candle_core::{DType, Storage, Tensor};

use super::{TensorError, TraceTensor};
use crate::stats::{FiniteMoments, TensorStats};

impl From<candle_core::Error> for TensorError {
    fn from(error: candle_core::Error) -> Self {
        TensorError::Backend(error.to_string())
    }
}

impl TraceTensor for Tensor {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(self.dims())
    }

    fn dtype_name(&self) -> &'static str {
        self.dtype().as_str()
    }

    /// Always a copy: candle lends its data only under a lock guard, which a `Cow` cannot hold.
    /// [`with_f32`](TraceTensor::with_f32) reads `f32` CPU tensors in place.
    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        let flat = self.flatten_all()?.to_dtype(DType::F32)?;
        Ok(Cow::Owned(flat.to_vec1::<f32>()?))
    }

    fn with_f32(&self, read: &mut dyn FnMut(&[f32])) -> Result<(), TensorError> {
        if self.device().is_cpu() && self.dtype() == DType::F32 {
            let (storage, layout) = self.storage_and_layout();
            if let (Storage::Cpu(cpu), Some((start, end))) =
                (&*storage, layout.contiguous_offsets())
            {
                let data = cpu.as_slice::<f32>()?;
                if let Some(data) = data.get(start..end) {
                    read(data);
                    return Ok(());
                }
            }
        }
        read(&self.to_f32()?);
        Ok(())
    }

    fn on_host(&self) -> bool {
        self.device().is_cpu()
    }

    fn stats(&self) -> Result<TensorStats, TensorError> {
        if self.device().is_cpu() {
            let mut stats = TensorStats::default();
            self.with_f32(&mut |data| stats = TensorStats::from_slice(data))?;
            return Ok(stats);
        }
        Ok(device_stats(self)?)
    }
}

/// Statistics with candle ops on the tensor's own device; three small copies to the host.
///
/// Two passes over the data: the mean first, then the sums of deviations from it, so that
/// `std` keeps its precision with `f32` device sums (see [`FiniteMoments`]). NaN is found as
/// `x != x`; finite values as `|x| < inf`.
pub(crate) fn device_stats(tensor: &Tensor) -> candle_core::Result<TensorStats> {
    let count = tensor.elem_count();
    if count == 0 {
        return Ok(TensorStats::default());
    }
    let x = tensor.flatten_all()?.to_dtype(DType::F32)?;
    let nan = x.ne(&x)?;
    let finite = x.abs()?.lt(f32::INFINITY)?;
    let counts = Tensor::stack(
        &[
            nan.to_dtype(DType::U32)?.sum_all()?,
            finite.to_dtype(DType::U32)?.sum_all()?,
        ],
        0,
    )?
    .to_vec1::<u32>()?;
    let (nan_count, finite_count) = (counts[0] as usize, counts[1] as usize);
    let inf_count = count.saturating_sub(nan_count + finite_count);
    let mut moments = FiniteMoments {
        count,
        nan_count,
        inf_count,
        ..FiniteMoments::default()
    };
    if finite_count == 0 {
        return Ok(TensorStats::from_moments(&moments));
    }
    let zeros = x.zeros_like()?;
    let finite_x = finite.where_cond(&x, &zeros)?;
    #[allow(clippy::cast_precision_loss)]
    let mean = f64::from(finite_x.sum_all()?.to_scalar::<f32>()?) / finite_count as f64;
    let deviation = finite.where_cond(&x.affine(1.0, -mean)?, &zeros)?;
    let positive_inf = Tensor::full(f32::INFINITY, x.shape(), x.device())?;
    let negative_inf = Tensor::full(f32::NEG_INFINITY, x.shape(), x.device())?;
    let scalars = Tensor::stack(
        &[
            deviation.sum_all()?,
            deviation.sqr()?.sum_all()?,
            finite.where_cond(&x, &positive_inf)?.min_all()?,
            finite.where_cond(&x, &negative_inf)?.max_all()?,
        ],
        0,
    )?
    .to_vec1::<f32>()?;
    moments.shift = mean;
    moments.sum = f64::from(scalars[0]);
    moments.sum_sq = f64::from(scalars[1]);
    moments.min = scalars[2];
    moments.max = scalars[3];
    Ok(TensorStats::from_moments(&moments))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn device_reduction_matches_the_host_statistics() {
        let mut values: Vec<f32> = (0..1000).map(|i| 100.0 + (i as f32 * 0.37).sin()).collect();
        values[3] = f32::NAN;
        values[7] = f32::INFINITY;
        values[11] = f32::NEG_INFINITY;
        let tensor = Tensor::from_vec(values.clone(), (10, 100), &Device::Cpu).unwrap();
        let device = device_stats(&tensor).unwrap();
        let host = TensorStats::from_slice(&values);
        assert_eq!(device.count, host.count);
        assert_eq!(device.nan_count, 1);
        assert_eq!(device.inf_count, 2);
        assert_eq!(device.min, host.min);
        assert_eq!(device.max, host.max);
        assert!((device.mean - host.mean).abs() < 1e-5 * host.mean.abs());
        assert!((device.std - host.std).abs() < 1e-4 * host.std);
        assert!((device.l2_norm - host.l2_norm).abs() < 1e-5 * host.l2_norm);
    }

    #[test]
    fn device_reduction_of_all_nan_and_empty() {
        let nan = Tensor::from_vec(vec![f32::NAN; 4], 4, &Device::Cpu).unwrap();
        let stats = device_stats(&nan).unwrap();
        assert_eq!((stats.count, stats.nan_count, stats.mean), (4, 4, 0.0));
        let empty = Tensor::from_vec(Vec::<f32>::new(), 0, &Device::Cpu).unwrap();
        assert_eq!(device_stats(&empty).unwrap().count, 0);
    }
}
