//! The token ids a forward pass consumes: what `#[trace_model(tokens = EXPR)]` takes, written in
//! the pass's `pass_begin` event so that a reference can be run on exactly the same tokens.

use std::fmt;

use super::TensorError;

/// A borrow of the token ids one forward pass consumes, as `#[trace_model(tokens = EXPR)]`
/// takes them: `&[u32]`, `&Vec<u32>`, `&[u32; N]` or `[u32; N]`, and the same of any other
/// integer type (`u8` to `u64`, `i8` to `i64`, `usize`, `isize`); with the `candle` feature, a
/// `&candle_core::Tensor` of an integer dtype, `[seq]` or `[batch, seq]`, on any device; with
/// the `burn` feature, a `&burn_tensor::Tensor<1, Int>` or `&Tensor<2, Int>` (a burn model that
/// takes its ids by value writes `tokens = &ids`).
///
/// Ids are read in order; a `[batch, seq]` tensor gives its rows one after another (the trace
/// does not mark where a row ends: the layers' shapes say the batch). Implement it for a borrow
/// of your own type of ids.
#[diagnostic::on_unimplemented(
    message = "`tokens` takes a borrow of the pass's token ids (`&[u32]`, `&Vec<i64>`, an \
               array of integers, or an integer `&Tensor` of candle or burn), not `{Self}`",
    label = "expected token ids"
)]
pub trait PassTokens {
    /// The ids, in the order the pass consumes them.
    fn token_ids(self) -> Result<Vec<u32>, TokensError>;
}

/// Why a value given as a pass's token ids could not be read; recorded as an error of the
/// session (kind `shape` for a rank, else `read`), the pass begun without its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokensError {
    /// An id below 0 or above `u32::MAX`.
    OutOfRange {
        /// The id.
        id: i128,
    },
    /// A tensor whose element type is not an integer type.
    NotIntegers {
        /// The element type, as the backend names it.
        dtype: &'static str,
    },
    /// A tensor that is neither `[seq]` nor `[batch, seq]`.
    Rank {
        /// Its shape.
        shape: Vec<usize>,
    },
    /// The tensor's values could not be read (a device or layout error).
    Read(TensorError),
}

impl fmt::Display for TokensError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { id } => write!(f, "token id {id} is not in 0..=4294967295"),
            Self::NotIntegers { dtype } => {
                write!(f, "token ids must be integers, not {dtype} values")
            }
            Self::Rank { shape } => write!(
                f,
                "token ids are read as [seq] or [batch, seq], not a tensor of shape {shape:?}"
            ),
            Self::Read(error) => write!(f, "token ids could not be read: {error}"),
        }
    }
}

impl std::error::Error for TokensError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read(error) => Some(error),
            _ => None,
        }
    }
}

impl From<TensorError> for TokensError {
    fn from(error: TensorError) -> Self {
        Self::Read(error)
    }
}

/// Implements [`PassTokens`] for borrows of slices, `Vec`s and arrays of each integer type.
macro_rules! integer_ids {
    ($($id:ty)*) => {$(
        impl PassTokens for &[$id] {
            #[allow(clippy::cast_lossless, trivial_numeric_casts, clippy::unnecessary_cast)]
            fn token_ids(self) -> Result<Vec<u32>, TokensError> {
                self.iter()
                    .map(|&id| {
                        u32::try_from(id).map_err(|_| TokensError::OutOfRange { id: id as i128 })
                    })
                    .collect()
            }
        }

        impl PassTokens for &Vec<$id> {
            fn token_ids(self) -> Result<Vec<u32>, TokensError> {
                self.as_slice().token_ids()
            }
        }

        impl<const N: usize> PassTokens for &[$id; N] {
            fn token_ids(self) -> Result<Vec<u32>, TokensError> {
                self.as_slice().token_ids()
            }
        }

        impl<const N: usize> PassTokens for [$id; N] {
            fn token_ids(self) -> Result<Vec<u32>, TokensError> {
                self.as_slice().token_ids()
            }
        }
    )*};
}

integer_ids!(u8 u16 u32 u64 usize i8 i16 i32 i64 isize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_vecs_and_arrays_of_any_integer_type_give_their_ids_in_order() {
        let ids: Vec<u32> = vec![1, 9152, 28];
        assert_eq!(ids.as_slice().token_ids(), Ok(vec![1, 9152, 28]));
        assert_eq!((&ids).token_ids(), Ok(vec![1, 9152, 28]));
        assert_eq!([7_i64, 0].token_ids(), Ok(vec![7, 0]));
        assert_eq!((&[3_usize; 2]).token_ids(), Ok(vec![3, 3]));
        assert_eq!((&[] as &[u8]).token_ids(), Ok(vec![]));
        assert_eq!((&vec![u32::MAX as u64]).token_ids(), Ok(vec![u32::MAX]));
    }

    #[test]
    fn ids_outside_u32_are_errors_naming_the_id() {
        let negative = [5_i64, -1].token_ids().unwrap_err();
        assert_eq!(negative, TokensError::OutOfRange { id: -1 });
        assert_eq!(negative.to_string(), "token id -1 is not in 0..=4294967295");
        let large = [1_u64 << 32].token_ids().unwrap_err();
        assert_eq!(large, TokensError::OutOfRange { id: 1 << 32 });
    }
}
