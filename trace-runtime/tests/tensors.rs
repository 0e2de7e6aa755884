//! Every `TraceTensor` implementation: shape, dtype name, values and statistics.

use std::borrow::Cow;

use trace_runtime::{TensorError, TensorRef, TensorStats, TraceTensor};

const VALUES: [f32; 6] = [1.0, -2.0, 3.5, 0.0, 4.0, -1.5];

/// Checks `tensor` against `VALUES` in row-major order with `shape`.
fn check<T: TraceTensor + ?Sized>(tensor: &T, shape: &[usize], dtype: &str) {
    assert_eq!(tensor.shape().as_ref(), shape);
    assert_eq!(tensor.dtype_name(), dtype);
    assert_eq!(tensor.to_f32().unwrap().as_ref(), &VALUES);
    let mut seen = Vec::new();
    tensor
        .with_f32(&mut |data| seen.extend_from_slice(data))
        .unwrap();
    assert_eq!(seen, VALUES);
    assert_eq!(tensor.stats().unwrap(), TensorStats::from_slice(&VALUES));
}

fn is_borrowed<T: TraceTensor + ?Sized>(tensor: &T) -> bool {
    matches!(tensor.to_f32().unwrap(), Cow::Borrowed(_))
}

#[test]
fn slices_vectors_arrays_and_references() {
    let vec = VALUES.to_vec();
    check(&VALUES, &[6], "f32");
    check(VALUES.as_slice(), &[6], "f32");
    check(&vec, &[6], "f32");
    check(&&vec, &[6], "f32");
    check(&&VALUES[..], &[6], "f32");
    check(&Box::new(vec.clone()), &[6], "f32");
    check(&std::rc::Rc::new(vec.clone()), &[6], "f32");
    check(&std::sync::Arc::<[f32]>::from(vec.as_slice()), &[6], "f32");
    let mut owned = vec.clone();
    check(&&mut owned, &[6], "f32");
    assert!(is_borrowed(&vec) && is_borrowed(&VALUES) && is_borrowed(VALUES.as_slice()));
}

#[test]
fn tensor_ref_checks_its_shape() {
    let shape = [2, 3];
    let tensor = TensorRef::new(&VALUES, &shape).unwrap();
    check(&tensor, &[2, 3], "f32");
    assert!(is_borrowed(&tensor));

    let error = TensorRef::new(&VALUES, &[4, 2]).unwrap_err();
    assert_eq!(
        error,
        TensorError::ShapeMismatch {
            shape: vec![4, 2],
            len: 6
        }
    );
    assert_eq!(
        error.to_string(),
        "shape [4, 2] holds 8 elements but 6 values were given"
    );
    let overflow = TensorRef::new(&VALUES, &[usize::MAX, 2]).unwrap_err();
    assert!(matches!(overflow, TensorError::ShapeOverflow { .. }));
    let boxed: Box<dyn std::error::Error> = Box::new(overflow);
    assert!(boxed.to_string().contains("overflows"));

    let scalar = [7.0f32];
    assert!(
        TensorRef::new(&scalar, &[]).is_ok(),
        "a 0-d shape holds one value"
    );
}

#[test]
fn empty_tensors() {
    let empty: Vec<f32> = Vec::new();
    assert_eq!(empty.shape().as_ref(), &[0]);
    assert_eq!(empty.stats().unwrap().count, 0);
}

/// A user type that only provides the required methods.
struct Doubled(Vec<f32>);

impl TraceTensor for Doubled {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.0.len()])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Owned(self.0.iter().map(|v| v * 2.0).collect()))
    }
}

#[test]
fn user_types_get_with_f32_and_stats_for_free() {
    let doubled = Doubled(VALUES.iter().map(|v| v / 2.0).collect());
    check(&doubled, &[6], "f32");
}

#[cfg(feature = "candle")]
mod candle_tensors {
    use candle_core::{DType, Device, Tensor};

    use super::*;

    #[test]
    fn f32_cpu_tensors_are_read_in_place() {
        let tensor = Tensor::from_vec(VALUES.to_vec(), (2, 3), &Device::Cpu).unwrap();
        check(&tensor, &[2, 3], "f32");
        let (storage, _) = tensor.storage_and_layout();
        let address = match &*storage {
            candle_core::Storage::Cpu(cpu) => cpu.as_slice::<f32>().unwrap().as_ptr(),
            _ => unreachable!(),
        };
        drop(storage);
        let mut lent = std::ptr::null();
        tensor.with_f32(&mut |data| lent = data.as_ptr()).unwrap();
        assert_eq!(lent, address, "with_f32 lends candle's own buffer");
    }

    #[test]
    fn views_with_an_offset_and_strided_views() {
        let base = Tensor::arange(0f32, 24.0, &Device::Cpu)
            .unwrap()
            .reshape((4, 6))
            .unwrap();
        let rows = base.narrow(0, 1, 2).unwrap();
        let expected: Vec<f32> = (6..18).map(|v| v as f32).collect();
        assert_eq!(rows.to_f32().unwrap().as_ref(), expected.as_slice());
        assert_eq!(rows.stats().unwrap(), TensorStats::from_slice(&expected));

        let transposed = base.t().unwrap();
        let expected: Vec<f32> = (0..6)
            .flat_map(|c| (0..4).map(move |r| (r * 6 + c) as f32))
            .collect();
        assert_eq!(TraceTensor::shape(&transposed).as_ref(), &[6, 4]);
        assert_eq!(transposed.to_f32().unwrap().as_ref(), expected.as_slice());
        let mut seen = Vec::new();
        transposed
            .with_f32(&mut |d| seen.extend_from_slice(d))
            .unwrap();
        assert_eq!(seen, expected);
    }

    #[test]
    fn other_dtypes_are_converted() {
        let f32s = Tensor::from_vec(VALUES.to_vec(), (3, 2), &Device::Cpu).unwrap();
        for dtype in [DType::F16, DType::BF16, DType::F64] {
            let tensor = f32s.to_dtype(dtype).unwrap();
            check(&tensor, &[3, 2], dtype.as_str());
        }
        let ints = Tensor::new(&[1u32, 5, 9], &Device::Cpu).unwrap();
        assert_eq!(ints.dtype_name(), "u32");
        assert_eq!(ints.to_f32().unwrap().as_ref(), &[1.0, 5.0, 9.0]);
    }
}

#[cfg(feature = "ndarray")]
mod ndarray_arrays {
    use ndarray::{Array2, ShapeBuilder};

    use super::*;

    #[test]
    fn owned_arrays_and_views() {
        let array = Array2::from_shape_vec((2, 3), VALUES.to_vec()).unwrap();
        check(&array, &[2, 3], "f32");
        check(&array.view(), &[2, 3], "f32");
        assert!(is_borrowed(&array));
        let dynamic = array.clone().into_dyn();
        check(&dynamic, &[2, 3], "f32");
    }

    #[test]
    fn column_major_and_strided_arrays_are_read_in_logical_order() {
        let column_major =
            Array2::from_shape_vec((2, 3).f(), vec![1.0, 0.0, -2.0, 4.0, 3.5, -1.5]).unwrap();
        check(&column_major, &[2, 3], "f32");

        let wide = Array2::from_shape_fn((2, 6), |(r, c)| (r * 6 + c) as f32);
        let every_other = wide.slice(::ndarray::s![.., ..;2]);
        assert_eq!(
            every_other.to_f32().unwrap().as_ref(),
            &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            every_other.stats().unwrap(),
            TensorStats::from_slice(&[0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
        );
    }
}
