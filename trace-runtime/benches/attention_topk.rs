//! Top-k of one attention row of 4096 keys: selection (ours) against sorting the whole row.
//!
//! `cargo bench -p trace-runtime --bench attention_topk`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use trace_runtime::{top_k_by_selection, AttentionWeightTrace};

const KEYS: usize = 4096;

/// A softmax row over pseudo-random scores (xorshift), shaped like real attention: a few heavy
/// keys and a long light tail.
fn attention_row(seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    let scores: Vec<f32> = (0..KEYS)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 12.0
        })
        .collect();
    let max = scores.iter().copied().fold(f32::MIN, f32::max);
    let exp: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// The approach selection replaces: sort every position by weight, keep the first k.
fn top_k_by_sort(weights: &[f32], k: usize) -> (Vec<usize>, Vec<f32>) {
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    order.truncate(k);
    let kept = order.iter().map(|&i| weights[i]).collect();
    (order, kept)
}

fn bench_top_k(c: &mut Criterion) {
    let row = attention_row(0x5eed);
    let mut group = c.benchmark_group("attention_topk_4096");
    for k in [5usize, 10, 32] {
        group.bench_with_input(BenchmarkId::new("selection", k), &k, |b, &k| {
            b.iter(|| {
                // fresh buffers each time, as a trace allocates them
                let (mut positions, mut kept) = (Vec::new(), Vec::new());
                top_k_by_selection(black_box(&row), k, 0.0, &mut positions, &mut kept);
                (positions, kept)
            });
        });
        group.bench_with_input(BenchmarkId::new("full_sort", k), &k, |b, &k| {
            b.iter(|| top_k_by_sort(black_box(&row), k));
        });
        group.bench_with_input(BenchmarkId::new("from_weights", k), &k, |b, &k| {
            b.iter(|| AttentionWeightTrace::from_weights(0, 0, KEYS - 1, black_box(&row), k));
        });
    }
    group.finish();
}

criterion_group!(benches, bench_top_k);
criterion_main!(benches);
