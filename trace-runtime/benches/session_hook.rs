//! Cost of a tracepoint as generated code pays it: `Callsite::is_active()` with no session, and
//! a whole `#[trace_layer]` call (enter with input statistics, output statistics, exit) on a
//! 576-element activation (SmolLM2's width) with a lightweight session.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use trace_runtime::__private::{probe, Callsite, LayerGuard, ModelGuard, TracepointKind};
use trace_runtime::{ModelTracerConfig, Session};

static LAYER: Callsite = Callsite::new(
    TracepointKind::Layer,
    "block",
    "block",
    module_path!(),
    file!(),
    line!(),
);
static MODEL: Callsite = Callsite::new(
    TracepointKind::Model,
    "forward",
    "forward",
    module_path!(),
    file!(),
    line!(),
);

/// The same function without the annotation: the baseline of the `layer_call` figures.
#[inline(never)]
fn plain_layer(x: &[f32]) -> &[f32] {
    black_box(x)
}

/// What `#[trace_layer] fn block(x: &[f32]) -> &[f32]` expands to, minus the body.
#[inline(never)]
fn traced_layer(x: &[f32]) -> &[f32] {
    let mut guard = if LAYER.is_active() {
        LayerGuard::enter(&LAYER, None, probe!(&x))
    } else {
        LayerGuard::inactive()
    };
    let out = black_box(x);
    if LAYER.is_active() {
        guard.output(probe!(&out));
    }
    out
}

fn hooks(c: &mut Criterion) {
    let x: Vec<f32> = (0..576).map(|i| ((i as f32) * 0.37).sin()).collect();

    c.bench_function("is_active/no_session", |b| {
        b.iter(|| black_box(&LAYER).is_active())
    });
    c.bench_function("layer_call/untraced", |b| {
        b.iter(|| plain_layer(black_box(&x)).len())
    });
    c.bench_function("layer_call/no_session", |b| {
        b.iter(|| traced_layer(black_box(&x)).len())
    });

    let filtered = Session::with_filter(ModelTracerConfig::lightweight(), "-layer:*,-tensor:*")
        .expect("valid filter");
    c.bench_function("is_active/session_filtered_out", |b| {
        b.iter(|| black_box(&MODEL).is_active() && black_box(&LAYER).is_active())
    });
    drop(filtered);

    let session = Session::with_filter(ModelTracerConfig::lightweight(), "").expect("valid filter");
    c.bench_function("is_active/lightweight_session", |b| {
        b.iter(|| black_box(&LAYER).is_active())
    });
    drop(session);
    // Passes of 30 layers, like SmolLM2, each in a session of its own; starting and finishing
    // it is not timed, so that memory stays bounded however many iterations criterion runs.
    c.bench_function("layer_call/lightweight_session_576", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let layers = left.min(30);
                let session = Session::with_filter(ModelTracerConfig::lightweight(), "")
                    .expect("valid filter");
                let pass = ModelGuard::enter(&MODEL, None, None);
                let start = Instant::now();
                for _ in 0..layers {
                    black_box(traced_layer(black_box(&x)));
                }
                timed += start.elapsed();
                drop(pass);
                black_box(session.finish());
                left -= layers;
            }
            timed
        })
    });
    c.bench_function("stats/from_slice_576", |b| {
        b.iter(|| trace_runtime::TensorStats::from_slice(black_box(&x)))
    });
}

criterion_group!(benches, hooks);
criterion_main!(benches);
