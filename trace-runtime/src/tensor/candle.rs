//! `candle_core::Tensor` as a [`TraceTensor`]: every dtype, every device; and a borrow of an
//! integer tensor as a pass's [`PassTokens`].
//!
//! On the CPU an `f32` contiguous tensor is read in place, under candle's storage lock. A CUDA
//! tensor (with this crate's `cuda` feature) is summarised on the GPU by one kernel, or copied to
//! pinned host memory when it needs a digest, and read back with every other tensor of the
//! forward pass ([`TraceTensor::start_summary`]). Any other device's tensors are copied to the
//! host: candle's own ops would take dozens of kernel launches and synchronising copies a tensor.

use std::borrow::Cow;

use candle_core::{DType, Storage, Tensor};

use super::{PassTokens, PendingSummary, SummaryRequest, TensorError, TokensError, TraceTensor};
use crate::stats::TensorStats;

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
        if self.elem_count() == 0 {
            // Nothing to copy (and a device may refuse an allocation of 0 bytes).
            return Ok(Cow::Owned(Vec::new()));
        }
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
        if let Some(read) = self.start_summary(&SummaryRequest::stats()) {
            return Ok(read?.finish()?.stats);
        }
        let mut stats = TensorStats::default();
        self.with_f32(&mut |data| stats = TensorStats::from_slice(data))?;
        Ok(stats)
    }

    fn start_summary(
        &self,
        request: &SummaryRequest,
    ) -> Option<Result<PendingSummary, TensorError>> {
        #[cfg(feature = "cuda")]
        if self.device().is_cuda() {
            return super::cuda::start_summary(self, request);
        }
        let _ = request;
        None
    }

    /// A new tensor of `shape` on the same device with the same dtype (the `f32` values
    /// converted as candle converts them: to nearest for `f16`/`bf16`). The old tensor's
    /// storage is left alone: other handles to it keep its values.
    fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
        super::check_count(values, shape)?;
        let host = Tensor::from_slice(values, shape, &candle_core::Device::Cpu)?;
        *self = host.to_dtype(self.dtype())?.to_device(self.device())?;
        Ok(())
    }
}

/// `[seq]` or `[batch, seq]` of an integer dtype, the rows one after another, copied to the host
/// (a device's tensor: one synchronising copy a pass).
impl PassTokens for &Tensor {
    fn token_ids(self) -> Result<Vec<u32>, TokensError> {
        if !matches!(self.rank(), 1 | 2) {
            return Err(TokensError::Rank {
                shape: self.dims().to_vec(),
            });
        }
        let read = |error: candle_core::Error| TokensError::Read(error.into());
        let flat = || self.flatten_all().map_err(read);
        match self.dtype() {
            DType::U32 => flat()?.to_vec1::<u32>().map_err(read),
            DType::U8 => flat()?.to_vec1::<u8>().map_err(read)?.token_ids(),
            DType::I16 => flat()?.to_vec1::<i16>().map_err(read)?.token_ids(),
            DType::I32 => flat()?.to_vec1::<i32>().map_err(read)?.token_ids(),
            DType::I64 => flat()?.to_vec1::<i64>().map_err(read)?.token_ids(),
            other => Err(TokensError::NotIntegers {
                dtype: other.as_str(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn values() -> Vec<f32> {
        let mut values: Vec<f32> = (0..1000).map(|i| 100.0 + (i as f32 * 0.37).sin()).collect();
        values[3] = f32::NAN;
        values[7] = f32::INFINITY;
        values[11] = f32::NEG_INFINITY;
        values
    }

    #[test]
    fn host_tensors_are_read_now_and_in_place() {
        let tensor = Tensor::from_vec(values(), (10, 100), &Device::Cpu).unwrap();
        assert!(tensor.start_summary(&SummaryRequest::stats()).is_none());
        assert_eq!(tensor.stats().unwrap(), TensorStats::from_slice(&values()));
    }

    #[test]
    fn views_and_half_precision_are_converted_first() {
        let tensor = Tensor::from_vec(values(), (10, 100), &Device::Cpu).unwrap();
        let transposed = tensor.t().unwrap();
        let expected: Vec<f32> = transposed
            .contiguous()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(
            transposed.stats().unwrap(),
            TensorStats::from_slice(&expected)
        );
        for dtype in [DType::F16, DType::BF16] {
            let half = tensor.to_dtype(dtype).unwrap();
            let widened: Vec<f32> = half
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let stats = half.stats().unwrap();
            assert_eq!(stats, TensorStats::from_slice(&widened), "{dtype:?}");
            assert_eq!((stats.nan_count, stats.inf_count), (1, 2));
        }
    }

    #[test]
    fn overwriting_keeps_dtype_and_device_and_leaves_other_handles_alone() {
        let original = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], (2, 2), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let mut replaced = original.clone();
        replaced.overwrite(&[0.5, 1.5, 2.5], &[3]).unwrap();
        assert_eq!(replaced.dtype(), DType::BF16);
        assert_eq!(replaced.dims(), [3]);
        let back: Vec<f32> = replaced.to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        assert_eq!(back, [0.5, 1.5, 2.5]);
        let kept: Vec<f32> = original
            .flatten_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(kept, [1.0, 2.0, 3.0, 4.0]);
        assert!(matches!(
            replaced.overwrite(&[1.0], &[2]),
            Err(TensorError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn integer_tensors_give_their_ids_and_a_batch_its_rows_in_order() {
        let ids = Tensor::new(&[1_u32, 9152, 28], &Device::Cpu).unwrap();
        assert_eq!((&ids).token_ids(), Ok(vec![1, 9152, 28]));
        let batch = Tensor::new(&[[1_i64, 2, 3], [4, 5, 6]], &Device::Cpu).unwrap();
        assert_eq!((&batch).token_ids(), Ok(vec![1, 2, 3, 4, 5, 6]));
        // A view: the transposed batch's rows are its columns.
        let columns = batch.t().unwrap();
        assert_eq!((&columns).token_ids(), Ok(vec![1, 4, 2, 5, 3, 6]));
        let small = Tensor::new(&[1_i64, 200, 28], &Device::Cpu).unwrap();
        for dtype in [DType::U8, DType::I16, DType::I32] {
            let converted = small.to_dtype(dtype).unwrap();
            assert_eq!((&converted).token_ids(), Ok(vec![1, 200, 28]), "{dtype:?}");
        }
    }

    #[test]
    fn float_tensors_other_ranks_and_negative_ids_are_errors() {
        let floats = Tensor::new(&[1_f32, 2.0], &Device::Cpu).unwrap();
        assert_eq!(
            (&floats).token_ids(),
            Err(TokensError::NotIntegers { dtype: "f32" })
        );
        let scalar = Tensor::new(3_u32, &Device::Cpu).unwrap();
        assert_eq!(
            (&scalar).token_ids(),
            Err(TokensError::Rank { shape: vec![] })
        );
        let cube = Tensor::zeros((1, 2, 2), DType::U32, &Device::Cpu).unwrap();
        assert_eq!(
            (&cube).token_ids(),
            Err(TokensError::Rank {
                shape: vec![1, 2, 2]
            })
        );
        let negative = Tensor::new(&[[4_i64, -100]], &Device::Cpu).unwrap();
        assert_eq!(
            (&negative).token_ids(),
            Err(TokensError::OutOfRange { id: -100 })
        );
    }
}
