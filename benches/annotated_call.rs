//! What the annotations cost per forward pass, and per layer call, in nanoseconds, next to the
//! same functions without them, at SmolLM2-135M's shape: a `#[trace_model]` pass of 30
//! `#[trace_layer]` calls, each on one token's 576-value activation (its hidden size).
//!
//! Each layer does almost nothing (it returns its input minus the first value), so the
//! difference between the twins is the annotations. A pass is timed whole: its begin, its 30
//! layer calls and its end, where the session closes the pass (anomaly detection over its
//! layers, the pass's event to every sink). Cases:
//!
//! * `plain/no_session`: the unannotated twin.
//! * `annotated/no_session`: tracing compiled in, no session on the thread: one thread-local
//!   check per tracepoint.
//! * `annotated/lightweight`: a [`ModelTracerConfig::lightweight`] session (in-memory tracer): a
//!   layer record per call, with statistics of the input and the output.
//! * `annotated/lightweight_file`: the same, also writing a trace file (every tensor's summary
//!   with its BLAKE3 digest and sketch, encoded and written through a buffer).
//! * `annotated/filtered_out`: the lightweight session limited by `-layer:*`. A layer keeps the
//!   pass structure even then (numbering, the enclosing layer of attention), so the call still
//!   enters and leaves a layer frame, without statistics.
//! * `annotated/layer_unused`: a session that records only the KV cache, which needs no layer
//!   structure: the layer tracepoint is inactive, the cached decision is a load and a branch.
//! * `plain/stats_only`: no tracing, just `TensorStats::from_slice` of each layer's input and
//!   output: the part of `lightweight` that is arithmetic rather than bookkeeping.
//!
//! Records accumulate while a session is open, so every measurement runs in chunks of
//! [`PASSES`] passes, each chunk with a fresh session (and a fresh trace file); starting and
//! finishing sessions is not timed.
//!
//! After criterion's own report (time per pass), the cases are measured again interleaved, one
//! chunk of each per round with the order rotating, so that slow drift of the machine (other
//! jobs, frequency) affects every case alike. It prints each case's median ns per pass and its
//! median excess over the plain twin in the same round, per layer call (the pass's excess over
//! 30; the pass's begin and end are spread over its layers), with a 95% interval of that median
//! (distribution-free, from order statistics over the rounds).
//!
//! Meaningful with `--features enabled`; without it the annotations are compiled out and the
//! twins measure the same code.
//!
//! ```text
//! cargo bench -p model-trace --features enabled --bench annotated_call -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::Criterion;
use model_trace::{
    trace_layer, trace_model, ModelTracerConfig, Session, TensorStats, TraceFileSink, TraceFilter,
};

/// The hidden size of SmolLM2-135M: one token's activation.
const WIDTH: usize = 576;
/// The blocks of SmolLM2-135M: layer calls per pass.
const LAYERS: usize = 30;
/// Passes per session: bounds the records a session holds.
const PASSES: u64 = 128;
/// Rounds of the interleaved measurement.
const ROUNDS: usize = 101;

#[inline(never)]
fn layer_plain(x: &[f32]) -> &[f32] {
    &x[1..]
}

#[trace_layer]
#[inline(never)]
fn layer_annotated(x: &[f32]) -> &[f32] {
    &x[1..]
}

#[inline(never)]
fn forward_plain(x: &[f32]) -> usize {
    (0..LAYERS).map(|_| layer_plain(black_box(x)).len()).sum()
}

#[trace_model]
#[inline(never)]
fn forward_annotated(x: &[f32]) -> usize {
    (0..LAYERS)
        .map(|_| layer_annotated(black_box(x)).len())
        .sum()
}

#[inline(never)]
fn forward_stats_only(x: &[f32]) -> usize {
    (0..LAYERS)
        .map(|_| {
            let input = black_box(x);
            let output = layer_plain(input);
            black_box(TensorStats::from_slice(input));
            black_box(TensorStats::from_slice(output));
            output.len()
        })
        .sum()
}

#[derive(Clone, Copy)]
enum Case {
    PlainNoSession,
    NoSession,
    Lightweight,
    LightweightFile,
    FilteredOut,
    LayerUnused,
    StatsOnly,
}

impl Case {
    const ALL: [Case; 7] = [
        Case::PlainNoSession,
        Case::NoSession,
        Case::Lightweight,
        Case::LightweightFile,
        Case::FilteredOut,
        Case::LayerUnused,
        Case::StatsOnly,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::PlainNoSession => "plain/no_session",
            Case::NoSession => "annotated/no_session",
            Case::Lightweight => "annotated/lightweight",
            Case::LightweightFile => "annotated/lightweight_file",
            Case::FilteredOut => "annotated/filtered_out",
            Case::LayerUnused => "annotated/layer_unused",
            Case::StatsOnly => "plain/stats_only",
        }
    }

    fn start_session(self, trace_file: &PathBuf) -> Option<Session> {
        match self {
            Case::PlainNoSession | Case::NoSession | Case::StatsOnly => None,
            Case::Lightweight => Some(Session::with_trace_filter(
                ModelTracerConfig::lightweight(),
                TraceFilter::all(),
            )),
            Case::LightweightFile => Some(
                Session::builder(ModelTracerConfig::lightweight())
                    .sink(TraceFileSink::create(trace_file).expect("create the trace file"))
                    .start()
                    .expect("a session with a trace file"),
            ),
            Case::FilteredOut => Some(
                Session::with_filter(ModelTracerConfig::lightweight(), "-layer:*")
                    .expect("a valid filter"),
            ),
            Case::LayerUnused => Some(Session::with_trace_filter(
                ModelTracerConfig {
                    trace_kv_cache: true,
                    ..ModelTracerConfig::default()
                },
                TraceFilter::all(),
            )),
        }
    }

    /// Time of `passes` passes, in chunks of [`PASSES`] with a fresh session each.
    fn measure(self, input: &[f32], passes: u64, trace_file: &PathBuf) -> Duration {
        let forward = match self {
            Case::PlainNoSession => forward_plain,
            Case::StatsOnly => forward_stats_only,
            _ => forward_annotated,
        };
        let mut total = Duration::ZERO;
        let mut left = passes;
        while left > 0 {
            let chunk = left.min(PASSES);
            let session = self.start_session(trace_file);
            let start = Instant::now();
            for _ in 0..chunk {
                black_box(forward(black_box(input)));
            }
            total += start.elapsed();
            if let Some(session) = session {
                let (tracer, errors) = session.finish_with_errors();
                assert!(errors.is_empty(), "{}: {errors:?}", self.name());
                black_box(tracer);
            }
            left -= chunk;
        }
        total
    }
}

fn criterion_cases(criterion: &mut Criterion, input: &[f32], trace_file: &PathBuf) {
    let mut group = criterion.benchmark_group("annotated_pass_30x576");
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            b.iter_custom(|passes| case.measure(input, passes, trace_file))
        });
    }
    group.finish();
}

fn interleaved_medians(input: &[f32], trace_file: &PathBuf) {
    let mut per_pass: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); Case::ALL.len()];
    for round in 0..ROUNDS {
        for offset in 0..Case::ALL.len() {
            let at = (round + offset) % Case::ALL.len();
            let elapsed = Case::ALL[at].measure(input, PASSES, trace_file);
            per_pass[at].push(elapsed.as_nanos() as f64 / PASSES as f64);
        }
    }
    println!(
        "\ninterleaved, {ROUNDS} rounds of {PASSES} passes of {LAYERS} layers over {WIDTH} values \
         ({}):\n\
         {:<28} {:>12}   {:>30}",
        if model_trace::tracepoints().is_empty() {
            "tracing compiled out"
        } else {
            "tracing compiled in"
        },
        "case",
        "median ns/pass",
        "ns/layer call over plain [95%]"
    );
    let plain = &per_pass[0];
    for (case, passes) in Case::ALL.iter().zip(&per_pass) {
        // Paired by round: each round's excess over the plain twin measured in that round.
        let mut excess: Vec<f64> = passes
            .iter()
            .zip(plain)
            .map(|(pass, plain)| (pass - plain) / LAYERS as f64)
            .collect();
        excess.sort_by(f64::total_cmp);
        let (low, high) = median_interval(&excess);
        println!(
            "{:<28} {:>12.0}   {:>+9.2} [{:+.2} .. {:+.2}]",
            case.name(),
            median(&mut passes.clone()),
            median(&mut excess),
            low,
            high
        );
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// A 95% interval of the median of `sorted` (independent samples): the order statistics at
/// ranks `n/2 ± 0.98 √n` (the normal approximation of the binomial count below the median).
fn median_interval(sorted: &[f64]) -> (f64, f64) {
    let n = sorted.len() as f64;
    let half_width = 0.98 * n.sqrt();
    let rank = |r: f64| sorted[(r.max(0.0) as usize).min(sorted.len() - 1)];
    (
        rank((n / 2.0 - half_width).floor()),
        rank((n / 2.0 + half_width).ceil()),
    )
}

fn main() {
    let input: Vec<f32> = (0..WIDTH).map(|i| (i as f32 * 0.01).sin()).collect();
    // The twins must agree, or the comparison measures different work.
    assert_eq!(forward_plain(&input), forward_annotated(&input));
    assert_eq!(forward_plain(&input), forward_stats_only(&input));
    let trace_file = std::env::temp_dir().join(format!(
        "model-trace-annotated-call-{}.ndjson",
        std::process::id()
    ));

    let mut criterion = Criterion::default().configure_from_args();
    criterion_cases(&mut criterion, &input, &trace_file);
    criterion.final_summary();
    // Only under `cargo bench`: `cargo test --benches` runs each case once, as a smoke test.
    if std::env::args().any(|arg| arg == "--bench") {
        interleaved_medians(&input, &trace_file);
    }
    let _ = std::fs::remove_file(&trace_file);
}
