//! CUDA tensors read on the device (`TraceTensor::start_summary`) against the same values read on
//! the CPU: statistics to float rounding, digests bit for bit, every float dtype, views, NaN and
//! ±Inf, and batches of reads finished together (one readback) and one after another.
//!
//! Needs a GPU: without one (`Device::new_cuda(0)` fails) every test says so and passes, unless
//! `MODEL_TRACE_REQUIRE_GPU=1`, which makes a missing GPU a failure.
#![cfg(feature = "cuda")]

mod support;

use candle_core::{DType, Device, Tensor};
use trace_runtime::{SummaryRequest, TensorStats, TensorSummary, TraceTensor};

use support::cuda_device as gpu;

/// Values with a bit of everything: a large mean against the spread, NaN, ±Inf, zeros of both
/// signs, subnormals (of f32; f16/bf16 round them), and a tail that drifts.
fn values(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| match i % 997 {
            3 => f32::NAN,
            7 => f32::INFINITY,
            11 => f32::NEG_INFINITY,
            13 => -0.0,
            17 => 1e-40,
            _ => 100.0 + (i as f32 * 0.37).sin() + i as f32 * 1e-5,
        })
        .collect()
}

/// `tensor` and the views of it that the kernel must read in place.
fn views(tensor: &Tensor) -> Vec<(&'static str, Tensor)> {
    let (rows, cols) = tensor.dims2().unwrap();
    vec![
        ("whole", tensor.clone()),
        ("transposed", tensor.t().unwrap()),
        ("narrowed", tensor.narrow(1, 1, cols - 2).unwrap()),
        (
            "broadcast",
            tensor
                .narrow(0, 0, 1)
                .unwrap()
                .broadcast_as((3, rows.min(4), cols))
                .unwrap()
                .narrow(1, 0, 1)
                .unwrap(),
        ),
    ]
}

/// The values of `tensor` as the CPU sees them: copied to the CPU and widened there.
fn host_values(tensor: &Tensor) -> Vec<f32> {
    tensor
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn assert_close(what: &str, device: &TensorStats, host: &TensorStats) {
    assert_eq!(
        (device.count, device.nan_count, device.inf_count),
        (host.count, host.nan_count, host.inf_count),
        "{what}"
    );
    support::assert_same_extremes(what, device, host);
    for (name, d, h) in [
        ("mean", device.mean, host.mean),
        ("std", device.std, host.std),
        ("l2_norm", device.l2_norm, host.l2_norm),
    ] {
        let tolerance = 2e-6 * h.abs().max(1e-30);
        assert!((d - h).abs() <= tolerance, "{what}: {name} {d} vs {h}");
    }
}

fn cases(device: &Device, len: usize) -> Vec<(String, Tensor)> {
    let cols = 50;
    let base = Tensor::from_vec(values(len), (len / cols, cols), &Device::Cpu).unwrap();
    let mut cases = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let on_device = base.to_dtype(dtype).unwrap().to_device(device).unwrap();
        for (view, tensor) in views(&on_device) {
            cases.push((format!("{dtype:?} {view} of {len}"), tensor));
        }
    }
    cases
}

#[test]
fn statistics_read_on_the_device_are_the_cpus() {
    let Some(device) = gpu("statistics_read_on_the_device_are_the_cpus") else {
        return;
    };
    for len in [1000, 1_000_000] {
        for (what, tensor) in cases(&device, len) {
            let read = tensor.start_summary(&SummaryRequest::stats());
            let summary = read.expect("a CUDA float tensor is read later").unwrap();
            let summary = summary.finish().unwrap();
            assert!(!summary.has_digest(), "{what}");
            assert_eq!(summary.shape, tensor.dims(), "{what}");
            let host = TensorStats::from_slice(&host_values(&tensor));
            assert_close(&what, &summary.stats, &host);
            assert_close(&what, &tensor.stats().unwrap(), &host);
        }
    }
}

#[test]
fn digests_read_on_the_device_are_the_cpus_bit_for_bit() {
    let Some(device) = gpu("digests_read_on_the_device_are_the_cpus_bit_for_bit") else {
        return;
    };
    for (what, tensor) in cases(&device, 1000) {
        let summary = tensor
            .start_summary(&SummaryRequest::with_digest())
            .unwrap()
            .unwrap()
            .finish()
            .unwrap();
        let host = TensorSummary::of_values(
            tensor.dims().to_vec(),
            tensor.dtype().as_str(),
            &host_values(&tensor),
        );
        assert_eq!(summary.fingerprint, host.fingerprint, "{what}");
        assert_eq!(summary.sketch, host.sketch, "{what}");
        assert_eq!(summary.stats, host.stats, "{what}");
        let canonical = |v: &[f32]| {
            v.iter()
                .map(|&x| trace_runtime::canonical_bits(x))
                .collect::<Vec<_>>()
        };
        assert_eq!(canonical(&summary.head), canonical(&host.head), "{what}");
        assert_eq!(canonical(&summary.tail), canonical(&host.tail), "{what}");
    }
}

#[test]
fn small_tensors_below_the_threshold_are_copied_and_exact() {
    let Some(device) = gpu("small_tensors_below_the_threshold_are_copied_and_exact") else {
        return;
    };
    for (what, tensor) in cases(&device, 1000) {
        let request = SummaryRequest::stats().copy_below(10_000);
        let summary = tensor.start_summary(&request).unwrap().unwrap();
        let summary = summary.finish().unwrap();
        assert!(!summary.has_digest(), "{what}");
        let host = TensorStats::from_slice(&host_values(&tensor));
        assert_eq!(summary.stats, host, "{what}");
    }
}

#[test]
fn reads_finished_together_and_batch_after_batch_are_each_their_own() {
    let Some(device) = gpu("reads_finished_together_and_batch_after_batch_are_each_their_own")
    else {
        return;
    };
    // Two batches over the same slots: the second must not see the first's sums.
    for round in 0..3 {
        let tensors: Vec<Tensor> = (0..700)
            .map(|i| {
                let values: Vec<f32> = (0..64).map(|j| (i * 64 + j + round) as f32).collect();
                Tensor::from_vec(values, 64, &device).unwrap()
            })
            .collect();
        let mut reads = Vec::new();
        for (at, tensor) in tensors.iter().enumerate() {
            let request = if at % 3 == 0 {
                SummaryRequest::with_digest()
            } else {
                SummaryRequest::stats()
            };
            reads.push(tensor.start_summary(&request).unwrap().unwrap());
        }
        for (tensor, read) in tensors.iter().zip(reads) {
            let summary = read.finish().unwrap();
            let host = TensorStats::from_slice(&host_values(tensor));
            assert_close(&format!("round {round}"), &summary.stats, &host);
        }
    }
}

#[test]
fn tensors_the_kernel_does_not_read_are_read_now() {
    let Some(device) = gpu("tensors_the_kernel_does_not_read_are_read_now") else {
        return;
    };
    let ints = Tensor::from_vec(vec![1u32, 2, 3], 3, &device).unwrap();
    assert!(ints.start_summary(&SummaryRequest::stats()).is_none());
    assert_eq!(ints.stats().unwrap().max, 3.0);
    let empty = Tensor::from_vec(Vec::<f32>::new(), 0, &device).unwrap();
    assert!(empty.start_summary(&SummaryRequest::stats()).is_none());
    assert_eq!(empty.stats().unwrap().count, 0);
}
