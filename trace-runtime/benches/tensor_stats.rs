//! `TensorStats::from_slice` against trueno 0.18's and against one plain read of the same data,
//! at 576 values (one SmolLM2 token), 4K, 64K and 1M.
//!
//! `cargo bench -p trace-runtime --bench tensor_stats -- --warm-up-time 1 --measurement-time 3`
//!
//! Two plain reads of the same `Vec<f32>` bound the cost of touching the data. Both read every
//! element exactly once and add it up in `f32`; their results go to `black_box`, so the read
//! cannot be optimized away:
//! * `plain_sum_serial` is `iter().sum::<f32>()`: one dependent addition per element, what most
//!   code writes; limited by the latency of the addition, not by memory.
//! * `plain_sum_lanes` is the honest lower bound: the same sum over independent lanes, compiled
//!   for the widest vector unit the CPU has (AVX-512F: 128 lanes; AVX2: 64 lanes; else 64 lanes
//!   of the build target's SSE2), which is eight vector registers of accumulators, enough to hide
//!   the addition latency at two loads per cycle. It runs at the speed of the loads: L1 for 4K,
//!   L2 for 64K, L2/L3 for 1M elements (4 MiB) on a typical server core. The bench id names the
//!   variant that ran.
//!
//! Data stays in cache across iterations (criterion repeats the call on one buffer), for every
//! contender alike.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use trace_runtime::{StatsKernel, TensorStats};

/// 576 is one token's activation in SmolLM2-135M (its hidden size), what a layer of a decode step
/// hands the statistics: the size at which the per-call cost of tracing is paid.
const SIZES: [usize; 4] = [576, 4 << 10, 64 << 10, 1 << 20];

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
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_lanes_avx512(data: &[f32]) -> f32 {
    sum_lanes::<128>(data)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_lanes_avx2(data: &[f32]) -> f32 {
    sum_lanes::<64>(data)
}

/// The widest plain read this CPU runs, and its name for the bench id.
fn plain_sum_lanes() -> (fn(&[f32]) -> f32, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return (|data| unsafe { sum_lanes_avx512(data) }, "avx512_128_lanes");
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return (|data| unsafe { sum_lanes_avx2(data) }, "avx2_64_lanes");
        }
    }
    (sum_lanes::<64>, "portable_64_lanes")
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
        let (plain_read, plain_read_name) = plain_sum_lanes();
        group.bench_function(BenchmarkId::new("plain_sum_lanes", plain_read_name), |b| {
            b.iter(|| plain_read(black_box(&data)))
        });
        group.finish();
    }
}

criterion_group!(benches, tensor_stats);
criterion_main!(benches);
