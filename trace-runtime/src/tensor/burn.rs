//! burn's float tensors (`burn_tensor::Tensor<D>`, any rank, any device) as [`TraceTensor`]s,
//! and a borrow of an integer tensor (`&Tensor<1, Int>` or `&Tensor<2, Int>`) as a pass's
//! [`PassTokens`].
//!
//! burn 0.22 chooses the backend at run time, from the tensor's `Device` (Flex, NdArray, a
//! CubeCL GPU, ...), so one implementation covers every backend. Reading a burn tensor is a read
//! of its device: each tracepoint reads its tensor once (`try_to_data`, which clones the handle,
//! not the values), and statistics, the digest and a capture are all taken from that one copy.
//! There is no on-device reduction: on a GPU backend each read waits for the device.
//!
//! These implementations are tested in `examples/minilm-burn/tests/tensors.rs`, where a backend
//! is compiled in (this crate depends on `burn-tensor` without one).

use std::borrow::Cow;

use burn_tensor::{DType, Int, Tensor, TensorData};

use super::{check_count, PassTokens, TensorError, TokensError, TraceTensor};

/// A burn error (a failed device read, a dtype the data does not hold) as ours.
fn backend(error: impl std::fmt::Display) -> TensorError {
    TensorError::Backend(format!("burn: {error}"))
}

/// One device read of `tensor`, as `f32` values in row-major order. A quantized tensor is
/// dequantized on its device first (the values its matmuls stand for), other float types
/// widened on the host.
fn read_f32<const D: usize>(tensor: &Tensor<D>) -> Result<TensorData, TensorError> {
    let data = if matches!(tensor.dtype(), DType::QFloat(_)) {
        tensor.clone().dequantize().try_into_data()
    } else {
        tensor.try_to_data()
    }
    .map_err(backend)?;
    Ok(if data.dtype() == DType::F32 {
        data
    } else {
        data.convert::<f32>()
    })
}

fn as_f32(data: &TensorData) -> Result<&[f32], TensorError> {
    data.as_slice::<f32>().map_err(backend)
}

impl<const D: usize> TraceTensor for Tensor<D> {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(self.dims().to_vec())
    }

    /// burn's own names: `"f32"`, `"f16"`, `"bf16"`, `"f64"`, `"flex32"`, `"qfloat"`.
    fn dtype_name(&self) -> &'static str {
        self.dtype().name()
    }

    /// Always a copy: a burn tensor's values are only reachable through a read of its device.
    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        let data = read_f32(self)?;
        data.try_into_vec::<f32>().map(Cow::Owned).map_err(backend)
    }

    fn with_f32(&self, read: &mut dyn FnMut(&[f32])) -> Result<(), TensorError> {
        let data = read_f32(self)?;
        read(as_f32(&data)?);
        Ok(())
    }

    /// `true` on every backend: the statistics need the values on the host anyway (there is no
    /// on-device reduction for burn tensors), so a digest costs hashing, not another read.
    fn on_host(&self) -> bool {
        true
    }

    /// A new tensor of `shape` on the same device with the same dtype (the `f32` values
    /// converted as burn converts them). Other handles to the old tensor keep its values. The
    /// rank is the type's: a shape of another rank is an error.
    fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
        check_count(values, shape)?;
        if matches!(self.dtype(), DType::QFloat(_)) {
            return Err(TensorError::NotRebuildable(
                "a quantized burn tensor cannot be rebuilt from f32 values (which quantization, \
                 is the model's choice): change the float tensor it is quantized from"
                    .to_owned(),
            ));
        }
        if shape.len() != D {
            return Err(TensorError::NotRebuildable(format!(
                "a burn Tensor<{D}> cannot take values of shape {shape:?} (rank {}): its rank \
                 is part of its type",
                shape.len()
            )));
        }
        let data = TensorData::new(values.to_vec(), shape.to_vec()).convert_dtype(self.dtype());
        *self = Tensor::from_data(data, (&self.device(), self.dtype()));
        Ok(())
    }
}

/// `[seq]` or `[batch, seq]` token ids, the rows one after another, read from the device.
impl<const D: usize> PassTokens for &Tensor<D, Int> {
    fn token_ids(self) -> Result<Vec<u32>, TokensError> {
        if !matches!(D, 1 | 2) {
            return Err(TokensError::Rank {
                shape: self.dims().to_vec(),
            });
        }
        let ids = self.try_to_data().map_err(backend)?.convert::<i64>();
        ids.as_slice::<i64>().map_err(backend)?.token_ids()
    }
}
