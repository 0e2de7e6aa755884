//! `TensorStats::from_slice` against trueno 0.18's and against one plain read of the same data.
//!
//! `cargo bench -p trace-runtime --bench tensor_stats -- --warm-up-time 1 --measurement-time 3`
//!
//! Two plain reads bound the cost of touching the data: `plain_sum_serial` is
//! `iter().sum::<f32>()` (one dependent addition per element, as written by most code), and
//! `plain_sum_lanes` keeps 64 independent lanes in AVX2 registers (the widest the workspace's
//! Rust 1.85 can target), so it runs at the speed of the loads (L1 for 4K, L2 for 64K, L3 for
//! 1M elements on this machine).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use trace_runtime::{StatsKernel, TensorStats};

const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];

/// Activation-like data: mean 0.5, spread ~1, from a fixed xorshift sequence.
fn activations(len: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            let mut uniform = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32
            };
            0.5 + (uniform() + uniform() + uniform() - 1.5) * 2.0
        })
        .collect()
}

fn plain_sum_serial(data: &[f32]) -> f32 {
    data.iter().sum()
}

#[inline(always)]
fn sum_lanes<const W: usize>(data: &[f32]) -> f32 {
    let mut lanes = [0.0f32; W];
    let mut groups = data.chunks_exact(W);
    for group in &mut groups {
        for (lane, &x) in lanes.iter_mut().zip(group) {
            *lane += x;
        }
    }
    for (lane, &x) in lanes.iter_mut().zip(groups.remainder()) {
        *lane += x;
    }
    lanes.iter().sum()
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_lanes_avx2(data: &[f32]) -> f32 {
    sum_lanes::<64>(data)
}

fn plain_sum_lanes(data: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { sum_lanes_avx2(data) };
    }
    sum_lanes::<64>(data)
}

fn tensor_stats(c: &mut Criterion) {
    for len in SIZES {
        let data = activations(len);
        let mut group = c.benchmark_group(format!("tensor_stats/{len}"));
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(
            BenchmarkId::new("ours_dispatched", format!("{:?}", StatsKernel::detected())),
            |b| b.iter(|| TensorStats::from_slice(black_box(&data))),
        );
        for kernel in StatsKernel::ALL {
            if kernel.is_available() && kernel != StatsKernel::detected() {
                group.bench_function(BenchmarkId::new("ours", format!("{kernel:?}")), |b| {
                    b.iter(|| TensorStats::from_slice_with(black_box(&data), kernel))
                });
            }
        }
        group.bench_function("trueno_0_18", |b| {
            b.iter(|| trueno::brick::TensorStats::from_slice(black_box(&data)))
        });
        group.bench_function("plain_sum_serial", |b| {
            b.iter(|| plain_sum_serial(black_box(&data)))
        });
        group.bench_function("plain_sum_lanes", |b| {
            b.iter(|| plain_sum_lanes(black_box(&data)))
        });
        group.finish();
    }
}

criterion_group!(benches, tensor_stats);
criterion_main!(benches);
