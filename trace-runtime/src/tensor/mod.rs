//! The one trait through which tracepoints read user tensors, and its implementations.
//!
//! Tracing never needs more than the shape and the values as `f32`, so that is all the trait
//! asks for. Everything that can hand out a borrowed `&[f32]` does so, because copying a
//! tensor per tracepoint would dominate the cost of tracing. Backends whose data sits behind a
//! lock or on a device override [`TraceTensor::with_f32`] and [`TraceTensor::stats`] instead,
//! and a device's reads start with [`TraceTensor::start_summary`] and finish at the end of the
//! forward pass. A pass's token ids are read through [`PassTokens`] (`tokens`).

use std::borrow::Cow;
use std::fmt;

use crate::stats::TensorStats;

pub use deferred::{PendingSummary, SummaryRequest};
pub(crate) use summarize::{summarize, takes_digest, ValuesReader};
pub use tokens::{PassTokens, TokensError};

#[cfg(feature = "burn")]
mod burn;
#[cfg(feature = "candle")]
mod candle;
#[cfg(feature = "cuda")]
mod cuda;
mod deferred;
#[cfg(feature = "ndarray")]
mod ndarray;
mod summarize;
mod tokens;

/// A value that tracepoints can read as a tensor: a shape and `f32` values in row-major order.
///
/// The trait is object-safe; generated code handles every tensor as `&dyn TraceTensor`.
/// Implement it for your own tensor type by providing `shape`, `dtype_name` and `to_f32`;
/// override `with_f32` when the values can be lent without a copy only inside a scope (a
/// lock guard), and `stats` when the statistics can be reduced where the data lives.
pub trait TraceTensor {
    /// Dimensions, outermost first. Attention is read as `[.., heads, q_len, k_len]`, logits as
    /// `[.., vocab]`.
    fn shape(&self) -> Cow<'_, [usize]>;

    /// Name of the element type as the backend spells it (`"f32"`, `"bf16"`, ...).
    fn dtype_name(&self) -> &'static str;

    /// All values as `f32`, row-major. Borrowed when the data already is contiguous `f32` on
    /// the CPU; converted or copied otherwise.
    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError>;

    /// Lends all values as `f32`, row-major, to `read`.
    ///
    /// Exists next to [`to_f32`](Self::to_f32) because some backends can lend their data only
    /// while a guard is held, and a borrow cannot outlive the guard.
    fn with_f32(&self, read: &mut dyn FnMut(&[f32])) -> Result<(), TensorError> {
        read(&self.to_f32()?);
        Ok(())
    }

    /// Whether the values are in host memory, so that reading them costs no copy from a device
    /// (decides whether a digest is taken under [`DigestPolicy::HostOnly`](crate::DigestPolicy)).
    fn on_host(&self) -> bool {
        true
    }

    /// Statistics of all values.
    fn stats(&self) -> Result<TensorStats, TensorError> {
        let mut stats = TensorStats::default();
        self.with_f32(&mut |data| stats = TensorStats::from_slice(data))?;
        Ok(stats)
    }

    /// Starts reading the summary (statistics, and a digest if `request` asks) where the values
    /// live, to be [finished](PendingSummary::finish) later; `None` (the default) when the
    /// tensor is read now, through [`stats`](Self::stats) and [`with_f32`](Self::with_f32).
    ///
    /// For a tensor on a device: a read that waits for the device costs a synchronisation per
    /// tracepoint, which is what makes tracing a GPU model several times slower. A deferred read
    /// only queues work on the device; the session finishes the reads of a forward pass when the
    /// pass ends (when the `#[trace_model]` function returns, or unwinds), so the device is
    /// waited for once a pass. Until then the pass's events are held back, and reach the sinks
    /// in their order, complete, before the pass's end. Tensors whose values are needed at once
    /// (attention and logits rows, captures) are read now whatever this returns.
    fn start_summary(
        &self,
        request: &SummaryRequest,
    ) -> Option<Result<PendingSummary, TensorError>> {
        let _ = request;
        None
    }

    /// Replaces the tensor with `values` (row-major) of shape `shape`, keeping its element
    /// type and device: how an intervention (patching, ablation, steering, isolation) changes
    /// what the program goes on with. The default says the type cannot be rebuilt, which makes
    /// an intervention on it a record error rather than a silent no-op.
    ///
    /// The value overwritten is the tracepoint's own copy (a clone for a borrowed input), so the
    /// caller's tensor is never changed in place.
    fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
        let _ = (values, shape);
        Err(TensorError::NotRebuildable(format!(
            "a {} tensor of this type cannot be rebuilt from values (implement \
             `TraceTensor::overwrite`)",
            self.dtype_name()
        )))
    }
}

/// `Ok` when `shape` holds exactly `values.len()` elements.
fn check_count(values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TensorError::ShapeOverflow {
            shape: shape.to_vec(),
        })?;
    if count != values.len() {
        return Err(TensorError::ShapeMismatch {
            shape: shape.to_vec(),
            len: values.len(),
        });
    }
    Ok(())
}

/// Why a tensor could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorError {
    /// The shape's element count differs from the number of values.
    ShapeMismatch {
        /// The shape that was given.
        shape: Vec<usize>,
        /// Number of values that were given.
        len: usize,
    },
    /// The product of the shape's dimensions overflows `usize`.
    ShapeOverflow {
        /// The shape that was given.
        shape: Vec<usize>,
    },
    /// The backend reported an error (device, dtype conversion, layout).
    Backend(String),
    /// The tensor cannot be replaced by other values (see [`TraceTensor::overwrite`]): its type
    /// does not support it, or it is borrowed.
    NotRebuildable(String),
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ShapeMismatch { shape, len } => write!(
                f,
                "shape {shape:?} holds {} elements but {len} values were given",
                shape.iter().product::<usize>()
            ),
            Self::ShapeOverflow { shape } => {
                write!(f, "the element count of shape {shape:?} overflows usize")
            }
            Self::Backend(message) => write!(f, "tensor backend error: {message}"),
            Self::NotRebuildable(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for TensorError {}

/// A flat `f32` slice seen through an explicit shape, for code that keeps its activations in
/// plain buffers.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    data: &'a [f32],
    shape: &'a [usize],
}

impl<'a> TensorRef<'a> {
    /// Checks that `shape` describes exactly `data.len()` values; a mismatch is an error rather
    /// than a panic so that a wrong shape in user code cannot take the traced program down.
    pub fn new(data: &'a [f32], shape: &'a [usize]) -> Result<Self, TensorError> {
        check_count(data, shape)?;
        Ok(Self { data, shape })
    }

    /// The values, row-major.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }
}

impl TraceTensor for TensorRef<'_> {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(self.data))
    }
}

impl TraceTensor for [f32] {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.len()])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(self))
    }
}

impl<const N: usize> TraceTensor for [f32; N] {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![N])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(self))
    }

    /// Any shape of `N` elements (the array stays flat).
    fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
        check_count(values, shape)?;
        if values.len() != N {
            return Err(TensorError::ShapeMismatch {
                shape: vec![N],
                len: values.len(),
            });
        }
        self.copy_from_slice(values);
        Ok(())
    }
}

impl TraceTensor for Vec<f32> {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.len()])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(self))
    }

    /// Any shape (the vector stays flat).
    fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
        check_count(values, shape)?;
        self.clear();
        self.extend_from_slice(values);
        Ok(())
    }
}

/// Forwards every method, so that a wrapper keeps the backend's zero-copy and on-device paths.
macro_rules! forward_trace_tensor {
    ($($wrapper:ty),* $(,)?) => {$(
        impl<T: TraceTensor + ?Sized> TraceTensor for $wrapper {
            fn shape(&self) -> Cow<'_, [usize]> {
                (**self).shape()
            }

            fn dtype_name(&self) -> &'static str {
                (**self).dtype_name()
            }

            fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
                (**self).to_f32()
            }

            fn with_f32(&self, read: &mut dyn FnMut(&[f32])) -> Result<(), TensorError> {
                (**self).with_f32(read)
            }

            fn stats(&self) -> Result<TensorStats, TensorError> {
                (**self).stats()
            }

            fn on_host(&self) -> bool {
                (**self).on_host()
            }

            fn start_summary(
                &self,
                request: &SummaryRequest,
            ) -> Option<Result<PendingSummary, TensorError>> {
                (**self).start_summary(request)
            }

            $crate::tensor::overwrite_through!($wrapper);
        }
    )*};
}

/// A wrapper's `overwrite`: through a box or a `&mut` to the tensor itself; a shared
/// reference or pointer cannot change what it points to.
macro_rules! overwrite_through {
    (&mut T) => {
        fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
            (**self).overwrite(values, shape)
        }
    };
    (Box<T>) => {
        fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
            (**self).overwrite(values, shape)
        }
    };
    ($shared:ty) => {
        fn overwrite(&mut self, values: &[f32], shape: &[usize]) -> Result<(), TensorError> {
            let _ = (values, shape);
            Err(TensorError::NotRebuildable(
                "the value is borrowed (a reference, `Rc` or `Arc` to the tensor): return or \
                 take the tensor itself to let it be replaced"
                    .to_owned(),
            ))
        }
    };
}
use overwrite_through;

forward_trace_tensor!(&T, &mut T, Box<T>, std::rc::Rc<T>, std::sync::Arc<T>);
