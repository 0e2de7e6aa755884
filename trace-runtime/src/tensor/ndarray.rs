//! `ndarray` arrays of `f32` as [`TraceTensor`]s: owned arrays, views and shared arrays alike.

use std::borrow::Cow;

use ::ndarray::{ArrayBase, Data, Dimension};

use super::{TensorError, TraceTensor};
use crate::stats::TensorStats;

impl<S, D> TraceTensor for ArrayBase<S, D>
where
    S: Data<Elem = f32>,
    D: Dimension,
{
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(ArrayBase::shape(self))
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    /// Borrowed for arrays in standard (row-major, contiguous) layout; other layouts are copied
    /// in logical order.
    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(match self.as_slice() {
            Some(data) => Cow::Borrowed(data),
            None => Cow::Owned(self.iter().copied().collect()),
        })
    }

    /// Statistics do not depend on the order, so any contiguous layout (also column-major) is
    /// read in place.
    fn stats(&self) -> Result<TensorStats, TensorError> {
        Ok(match self.as_slice_memory_order() {
            Some(data) => TensorStats::from_slice(data),
            None => TensorStats::from_slice(&self.iter().copied().collect::<Vec<f32>>()),
        })
    }
}
