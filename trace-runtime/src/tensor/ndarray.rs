//! `ndarray` arrays of `f32` as [`TraceTensor`]s: owned arrays, views, shared and
//! copy-on-write arrays alike.
//!
//! One implementation per storage kind (rather than one over every `S: Data`), because what
//! [`TraceTensor::overwrite`] can do depends on it: an owned, shared or copy-on-write array takes
//! new values of any shape of its dimensionality, a mutable view new values of its own shape, and
//! a read-only view none.

use std::borrow::Cow;

use ::ndarray::{ArrayBase, CowRepr, Data, Dimension, IxDyn, OwnedArcRepr, OwnedRepr, ViewRepr};

use super::{check_count, TensorError, TraceTensor};
use crate::stats::TensorStats;

fn shape_of<S: Data<Elem = f32>, D: Dimension>(array: &ArrayBase<S, D>) -> Cow<'_, [usize]> {
    Cow::Borrowed(ArrayBase::shape(array))
}

/// Borrowed for arrays in standard (row-major, contiguous) layout; other layouts are copied in
/// logical order.
fn to_f32_of<S: Data<Elem = f32>, D: Dimension>(
    array: &ArrayBase<S, D>,
) -> Result<Cow<'_, [f32]>, TensorError> {
    Ok(match array.as_slice() {
        Some(data) => Cow::Borrowed(data),
        None => Cow::Owned(array.iter().copied().collect()),
    })
}

/// Statistics do not depend on the order, so any contiguous layout (also column-major) is read
/// in place.
fn stats_of<S: Data<Elem = f32>, D: Dimension>(array: &ArrayBase<S, D>) -> TensorStats {
    match array.as_slice_memory_order() {
        Some(data) => TensorStats::from_slice(data),
        None => TensorStats::from_slice(&array.iter().copied().collect::<Vec<f32>>()),
    }
}

/// An owned array of `D`'s dimensionality holding `values` in `shape`.
fn owned<D: Dimension>(
    values: &[f32],
    shape: &[usize],
) -> Result<ArrayBase<OwnedRepr<f32>, D>, TensorError> {
    check_count(values, shape)?;
    ArrayBase::from_shape_vec(IxDyn(shape), values.to_vec())
        .and_then(ArrayBase::into_dimensionality::<D>)
        .map_err(|e| TensorError::Backend(format!("shape {shape:?}: {e}")))
}

macro_rules! array_tensor {
    ($(#[$doc:meta])* [$($lt:lifetime)?] $repr:ty, |$array:ident, $values:ident, $shape:ident| $overwrite:block) => {
        $(#[$doc])*
        impl<$($lt,)? D: Dimension> TraceTensor for ArrayBase<$repr, D> {
            fn shape(&self) -> Cow<'_, [usize]> {
                shape_of(self)
            }

            fn dtype_name(&self) -> &'static str {
                "f32"
            }

            fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
                to_f32_of(self)
            }

            fn stats(&self) -> Result<TensorStats, TensorError> {
                Ok(stats_of(self))
            }

            fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
                let ($array, $values, $shape) = (self, values, shape);
                $overwrite
            }
        }
    };
}

array_tensor!(
    /// `Array`: replaced by an array of the new shape.
    [] OwnedRepr<f32>, |array, values, shape| {
        *array = owned(values, shape)?;
        Ok(())
    }
);

array_tensor!(
    /// `ArcArray`: replaced by a new shared array (other handles keep the old values).
    [] OwnedArcRepr<f32>, |array, values, shape| {
        *array = owned::<D>(values, shape)?.into_shared();
        Ok(())
    }
);

array_tensor!(
    /// `CowArray`: becomes an owned array of the new shape.
    ['a] CowRepr<'a, f32>, |array, values, shape| {
        *array = owned::<D>(values, shape)?.into();
        Ok(())
    }
);

array_tensor!(
    /// `ArrayViewMut`: the viewed values are written, so the shape must be the view's own.
    ['a] ViewRepr<&'a mut f32>, |array, values, shape| {
        check_count(values, shape)?;
        if shape != ArrayBase::shape(array) {
            return Err(TensorError::ShapeMismatch {
                shape: ArrayBase::shape(array).to_vec(),
                len: values.len(),
            });
        }
        for (slot, value) in array.iter_mut().zip(values) {
            *slot = *value;
        }
        Ok(())
    }
);

array_tensor!(
    /// `ArrayView`: read-only, so it cannot be replaced.
    ['a] ViewRepr<&'a f32>, |_array, values, shape| {
        let _ = (values, shape);
        Err(TensorError::NotRebuildable(
            "an `ArrayView` is read-only: return or take an owned array to let it be replaced"
                .to_owned(),
        ))
    }
);
