//! CUDA tensors through the public API: what [`TraceTensor`] reports for a tensor on the GPU is
//! what it reports for the same tensor on the CPU, for each float dtype a model keeps its
//! activations in, with NaN and ±Inf among the values, and for views that are not contiguous.
//!
//! Without a GPU each test says it skipped (see `support`); `scripts/cuda-check` builds and runs
//! this file against a stub driver, where `the_stub_driver_finds_no_device` checks that the
//! skip is real.
#![cfg(feature = "cuda")]

mod support;

use candle_core::{DType, Device, Tensor};
use trace_runtime::{TensorStats, TraceTensor};

use support::{cuda_device, env_flag};

/// `scripts/cuda-check` links the test binaries against a `libcuda` whose every function
/// returns CUDA_ERROR_NO_DEVICE, and sets `MODEL_TRACE_EXPECT_NO_GPU=1`. A stub that reported
/// success instead (a function that forgot its return value) would let GPU tests run on
/// garbage; a real driver there would mean the stub is not the library that was loaded.
#[test]
fn the_stub_driver_finds_no_device() {
    if !env_flag("MODEL_TRACE_EXPECT_NO_GPU") {
        return;
    }
    match Device::new_cuda(0) {
        Ok(_) => panic!(
            "MODEL_TRACE_EXPECT_NO_GPU=1, but CUDA device 0 opened: is the stub libcuda first \
             on LD_LIBRARY_PATH?"
        ),
        // The stub's own answer, not some other failure on the way to the driver.
        Err(error) => assert!(
            format!("{error:?}").contains("CUDA_ERROR_NO_DEVICE"),
            "{error:?}"
        ),
    }
}

const ROWS: usize = 67;
const COLS: usize = 129;

/// `ROWS × COLS` values of mixed sign and magnitude (1e-3 to 1e3, all within `f16`'s range),
/// with NaN, +Inf and -Inf placed in different rows and columns.
fn values() -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut values: Vec<f32> = (0..ROWS * COLS)
        .map(|_| {
            // xorshift64*: deterministic values without a dependency.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            let unit = bits as f32 / (1u64 << 24) as f32; // [0, 1)
            let magnitude = 10f32.powf(unit * 6.0 - 3.0);
            if bits.is_multiple_of(2) {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect();
    for (index, special) in [
        (5, f32::NAN),
        (COLS + 7, f32::NAN),
        (17 * COLS + 3, f32::INFINITY),
        (40 * COLS + 100, f32::NEG_INFINITY),
        (ROWS * COLS - 1, f32::NAN),
    ] {
        values[index] = special;
    }
    values
}

/// `device`'s statistics of `tensor` against the CPU's: counts, min and max exactly (the same
/// values, whatever the order), the moments within float rounding (both sum in `f64`, in
/// different orders; 1e-5 leaves room, `gpu_check verify` holds them to 2.5e-7).
fn assert_same_stats(what: &str, device: &TensorStats, host: &TensorStats) {
    assert_eq!(device.count, host.count, "{what}: count");
    assert_eq!(device.nan_count, host.nan_count, "{what}: nan_count");
    assert_eq!(device.inf_count, host.inf_count, "{what}: inf_count");
    support::assert_same_extremes(what, device, host);
    // The mean of values of both signs can be near zero: compare it on the scale of the spread.
    let scale = host.std + host.mean.abs();
    for (name, device, host, scale) in [
        ("mean", device.mean, host.mean, scale),
        ("std", device.std, host.std, host.std),
        ("l2_norm", device.l2_norm, host.l2_norm, host.l2_norm),
    ] {
        assert!(
            (device - host).abs() <= 1e-5 * scale,
            "{what}: {name} {device} on the device, {host} on the host"
        );
    }
}

/// Views whose elements are not one contiguous run: read through their layout.
fn views(tensor: &Tensor) -> [(&'static str, Tensor); 3] {
    [
        ("transposed", tensor.t().unwrap()),
        ("narrowed", tensor.narrow(1, 3, COLS - 10).unwrap()),
        ("a column", tensor.narrow(1, 7, 1).unwrap()),
    ]
}

#[test]
fn statistics_on_the_device_match_the_host() {
    let Some(gpu) = cuda_device("statistics_on_the_device_match_the_host") else {
        return;
    };
    let values = values();
    let cpu_f32 = Tensor::from_vec(values.clone(), (ROWS, COLS), &Device::Cpu).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // Converted on the CPU, then copied: both sides hold the same bits.
        let cpu = cpu_f32.to_dtype(dtype).unwrap();
        let on_gpu = cpu.to_device(&gpu).unwrap();
        assert!(
            !on_gpu.on_host(),
            "{dtype:?}: a CUDA tensor is not on the host"
        );
        assert_eq!(on_gpu.dtype_name(), cpu.dtype_name());
        assert_eq!(on_gpu.shape(), cpu.shape());

        let host = cpu.stats().unwrap();
        assert_eq!(host.count, ROWS * COLS);
        assert_eq!((host.nan_count, host.inf_count), (3, 2));
        assert_same_stats(&format!("{dtype:?}"), &on_gpu.stats().unwrap(), &host);

        for ((view, cpu_view), (_, gpu_view)) in views(&cpu).into_iter().zip(views(&on_gpu)) {
            assert_same_stats(
                &format!("{dtype:?} {view}"),
                &gpu_view.stats().unwrap(),
                &cpu_view.stats().unwrap(),
            );
            // The values themselves come back in row-major order of the view. NaN compared
            // by bits would fail on payloads (f16 NaN widens differently on the GPU).
            let (device_values, host_values) =
                (gpu_view.to_f32().unwrap(), cpu_view.to_f32().unwrap());
            assert_eq!(device_values.len(), host_values.len());
            for (index, (d, h)) in device_values.iter().zip(host_values.iter()).enumerate() {
                assert!(
                    d == h || (d.is_nan() && h.is_nan()),
                    "{dtype:?} {view}: value {index} is {d} on the device, {h} on the host"
                );
            }
        }
    }
}

#[test]
fn edge_cases_on_the_device_match_the_host() {
    let Some(gpu) = cuda_device("edge_cases_on_the_device_match_the_host") else {
        return;
    };
    let cases: [(&str, Vec<f32>); 5] = [
        ("empty", Vec::new()),
        ("one value", vec![-2.5]),
        ("only NaN", vec![f32::NAN; 33]),
        (
            "only ±Inf",
            vec![f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY],
        ),
        // A large mean over a small spread: single-pass f32 sums would lose the std here.
        (
            "offset",
            (0..4096u16)
                .map(|i| 1000.0 + f32::from(i % 7) * 1e-2)
                .collect(),
        ),
    ];
    for (name, values) in cases {
        let cpu = Tensor::from_vec(values.clone(), values.len(), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let cpu = cpu.to_dtype(dtype).unwrap();
            let host = cpu.stats().unwrap();
            let device = cpu.to_device(&gpu).unwrap().stats().unwrap();
            assert_same_stats(&format!("{name} {dtype:?}"), &device, &host);
        }
    }
}
