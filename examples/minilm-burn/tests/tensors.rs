//! The `burn` feature's reads and writes of burn tensors, on both CPU backends: statistics equal
//! those of the values read back by burn itself, other float dtypes converted first, an
//! overwrite that keeps dtype and device, token ids from integer tensors, and errors where a
//! value cannot be read or rebuilt. (Here rather than in the runtime's own tests because a
//! backend is needed, which the runtime does not depend on.)

use burn_tensor::{DType, Device, Int, Tensor, TensorData};
use minilm_burn::Backend;
use model_trace::{PassTokens, TensorError, TensorStats, TokensError, TraceTensor};

fn values() -> Vec<f32> {
    let mut values: Vec<f32> = (0..1000).map(|i| 100.0 + (i as f32 * 0.37).sin()).collect();
    values[3] = f32::NAN;
    values[7] = f32::INFINITY;
    values[11] = f32::NEG_INFINITY;
    values
}

fn tensor(device: &Device, dtype: DType) -> Tensor<2> {
    Tensor::from_data(TensorData::new(values(), [10, 100]), (device, dtype))
}

fn read_back<const D: usize>(tensor: &Tensor<D>) -> Vec<f32> {
    tensor
        .to_data()
        .convert::<f32>()
        .try_into_vec()
        .expect("f32 values")
}

/// Compared by bits, so that NaN equals NaN.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn statistics_are_those_of_the_values_burn_reads_back() {
    for backend in Backend::ALL {
        let device = backend.device();
        let tensor = tensor(&device, DType::F32);
        assert_eq!(TraceTensor::shape(&tensor).as_ref(), [10, 100]);
        assert_eq!(tensor.dtype_name(), "f32");
        let stats = tensor.stats().unwrap();
        assert_eq!(stats, TensorStats::from_slice(&values()), "{backend:?}");
        assert_eq!((stats.nan_count, stats.inf_count), (1, 2));
        // A view (burn's swap_dims) is read in its logical order.
        let swapped = tensor.clone().swap_dims(0, 1);
        let expected = bits(&read_back(&swapped));
        assert_ne!(expected, bits(&values()), "a view of another order");
        assert_eq!(bits(&swapped.to_f32().unwrap()), expected, "{backend:?}");
        let mut lent = Vec::new();
        swapped.with_f32(&mut |v| lent = bits(v)).unwrap();
        assert_eq!(lent, expected);
    }
}

#[test]
fn half_precision_is_widened_first_where_the_backend_has_it() {
    let mut read = 0;
    for backend in Backend::ALL {
        let device = backend.device();
        for dtype in [DType::F16, DType::BF16] {
            if !device.supports_dtype(dtype) {
                eprintln!("{backend:?} has no {dtype:?}");
                continue;
            }
            let half = tensor(&device, dtype);
            assert_eq!(half.dtype(), dtype);
            assert_eq!(half.dtype_name(), dtype.name());
            let stats = half.stats().unwrap();
            assert_eq!(
                stats,
                TensorStats::from_slice(&read_back(&half)),
                "{backend:?} {dtype:?}"
            );
            assert_eq!((stats.nan_count, stats.inf_count), (1, 2));
            read += 1;
        }
    }
    assert!(read > 0, "no backend here has a half-precision float type");
}

/// On Flex: burn-ndarray 0.22.1 panics inside its own quantization (`ops/qtensor.rs`), and both
/// backends' `supports_dtype` say no to the default scheme that Flex runs.
#[test]
fn a_quantized_tensor_is_read_dequantized_and_cannot_be_overwritten() {
    let scheme = burn_tensor::quantization::QuantScheme::default();
    let device = Backend::Flex.device();
    let plain: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    let float = Tensor::<2>::from_data(TensorData::new(plain.clone(), [4, 64]), &device);
    let mut quantized = float.quantize_dynamic(&scheme);
    assert!(matches!(quantized.dtype(), DType::QFloat(_)));
    assert_eq!(quantized.dtype_name(), "qfloat");
    let dequantized = read_back(&quantized.clone().dequantize());
    let stats = quantized.stats().unwrap();
    assert_eq!(stats, TensorStats::from_slice(&dequantized));
    assert!((stats.max - 1.0).abs() < 0.02, "{stats:?}");
    let error = quantized.overwrite(&plain, &[4, 64]).unwrap_err();
    assert!(matches!(error, TensorError::NotRebuildable(_)), "{error}");
}

#[test]
fn an_overwrite_keeps_dtype_and_device_and_leaves_other_handles_alone() {
    for backend in Backend::ALL {
        let device = backend.device();
        let original = Tensor::<2>::from_data([[1.0f32, 2.0], [3.0, 4.0]], &device);
        let mut replaced = original.clone();
        replaced.overwrite(&[0.5, 1.5, 2.5], &[3, 1]).unwrap();
        assert_eq!(replaced.dims(), [3, 1]);
        assert_eq!(replaced.dtype(), original.dtype());
        assert_eq!(replaced.device(), device);
        assert_eq!(read_back(&replaced), [0.5, 1.5, 2.5]);
        assert_eq!(read_back(&original), [1.0, 2.0, 3.0, 4.0], "{backend:?}");
        assert!(matches!(
            replaced.overwrite(&[1.0], &[2, 1]),
            Err(TensorError::ShapeMismatch { .. })
        ));
        let rank = replaced.overwrite(&[1.0, 2.0], &[2]).unwrap_err();
        assert!(
            matches!(&rank, TensorError::NotRebuildable(m) if m.contains("Tensor<2>")),
            "{rank}"
        );
    }
}

#[test]
fn integer_tensors_give_their_ids_and_a_batch_its_rows_in_order() {
    for backend in Backend::ALL {
        let device = backend.device();
        let ids = Tensor::<1, Int>::from_data([1, 9152, 28], &device);
        assert_eq!((&ids).token_ids(), Ok(vec![1, 9152, 28]));
        let batch = Tensor::<2, Int>::from_data([[1, 2, 3], [4, 5, 6]], &device);
        assert_eq!((&batch).token_ids(), Ok(vec![1, 2, 3, 4, 5, 6]));
        let columns = batch.clone().swap_dims(0, 1);
        assert_eq!((&columns).token_ids(), Ok(vec![1, 4, 2, 5, 3, 6]));
        let cube = Tensor::<3, Int>::zeros([1, 2, 2], &device);
        assert_eq!(
            (&cube).token_ids(),
            Err(TokensError::Rank {
                shape: vec![1, 2, 2]
            })
        );
        let negative = Tensor::<2, Int>::from_data([[4, -100]], &device);
        assert_eq!(
            (&negative).token_ids(),
            Err(TokensError::OutOfRange { id: -100 })
        );
    }
}
