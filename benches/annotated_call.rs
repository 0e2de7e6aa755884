//! What a `#[trace_layer]` annotation costs per call, in nanoseconds, next to an identical
//! function without it.
//!
//! The function does almost nothing (it returns its 576-value input minus the first value), so
//! the difference between the twins is the annotation. Cases:
//!
//! * `no_session`: tracing compiled in, no session on the thread: one thread-local check.
//! * `lightweight`: a [`ModelTracerConfig::lightweight`] session: a layer record per call,
//!   with statistics of the input and the output.
//! * `filtered_out`: the same session limited by `-layer:*`. A layer keeps the pass structure
//!   even then (numbering, the enclosing layer of attention), so the call still enters and
//!   leaves a layer frame, without statistics.
//! * `layer_unused`: a session that records only the KV cache, which needs no layer
//!   structure: the tracepoint is inactive, the cached decision is a load and a branch.
//! * `stats_only`: no tracing, just `TensorStats::from_slice` of the input and the output: the
//!   part of `lightweight` that is arithmetic rather than bookkeeping.
//!
//! Records accumulate while a session is open, so every measurement runs in chunks of
//! [`CHUNK`] calls, each with a fresh session; starting and finishing sessions is not timed.
//!
//! After criterion's own report, the cases are measured again interleaved (one chunk of each
//! per round, rotating the order) and the median ns per call of each is printed, so that slow
//! drift of the machine (other jobs, frequency) affects every case alike.
//!
//! Meaningful with `--features enabled`; without it the annotation is compiled out and both
//! twins measure the same code.
//!
//! ```text
//! cargo bench -p model-trace --features enabled --bench annotated_call -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use model_trace::{trace_layer, ModelTracerConfig, Session, TensorStats};

/// The hidden width of SmolLM-135M.
const WIDTH: usize = 576;
/// Calls per session: bounds the records a session holds.
const CHUNK: u64 = 4096;
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

#[derive(Clone, Copy)]
enum Case {
    PlainNoSession,
    NoSession,
    Lightweight,
    FilteredOut,
    LayerUnused,
    StatsOnly,
}

impl Case {
    const ALL: [Case; 6] = [
        Case::PlainNoSession,
        Case::NoSession,
        Case::Lightweight,
        Case::FilteredOut,
        Case::LayerUnused,
        Case::StatsOnly,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::PlainNoSession => "plain/no_session",
            Case::NoSession => "annotated/no_session",
            Case::Lightweight => "annotated/lightweight",
            Case::FilteredOut => "annotated/filtered_out",
            Case::LayerUnused => "annotated/layer_unused",
            Case::StatsOnly => "plain/stats_only",
        }
    }

    fn start_session(self) -> Option<Session> {
        match self {
            Case::PlainNoSession | Case::NoSession | Case::StatsOnly => None,
            Case::Lightweight => Some(Session::with_trace_filter(
                ModelTracerConfig::lightweight(),
                model_trace::TraceFilter::all(),
            )),
            Case::FilteredOut => Some(
                Session::with_filter(ModelTracerConfig::lightweight(), "-layer:*")
                    .expect("a valid filter"),
            ),
            Case::LayerUnused => Some(Session::with_trace_filter(
                ModelTracerConfig {
                    trace_kv_cache: true,
                    ..ModelTracerConfig::default()
                },
                model_trace::TraceFilter::all(),
            )),
        }
    }

    /// Time of `calls` calls, in chunks of [`CHUNK`] with a fresh session each.
    fn measure(self, input: &[f32], calls: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = calls;
        while left > 0 {
            let chunk = left.min(CHUNK);
            let session = self.start_session();
            let start = Instant::now();
            match self {
                Case::PlainNoSession => {
                    for _ in 0..chunk {
                        black_box(layer_plain(black_box(input)));
                    }
                }
                Case::StatsOnly => {
                    for _ in 0..chunk {
                        let input = black_box(input);
                        let output = layer_plain(input);
                        black_box(TensorStats::from_slice(input));
                        black_box(TensorStats::from_slice(output));
                    }
                }
                _ => {
                    for _ in 0..chunk {
                        black_box(layer_annotated(black_box(input)));
                    }
                }
            }
            total += start.elapsed();
            if let Some(session) = session {
                black_box(session.finish());
            }
            left -= chunk;
        }
        total
    }
}

fn criterion_cases(criterion: &mut Criterion, input: &[f32]) {
    let mut group = criterion.benchmark_group("annotated_call");
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            b.iter_custom(|iters| case.measure(input, iters))
        });
    }
    group.finish();
}

fn interleaved_medians(input: &[f32]) {
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); Case::ALL.len()];
    for round in 0..ROUNDS {
        for offset in 0..Case::ALL.len() {
            let at = (round + offset) % Case::ALL.len();
            let elapsed = Case::ALL[at].measure(input, CHUNK);
            samples[at].push(elapsed.as_nanos() as f64 / CHUNK as f64);
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    let plain = medians[0];
    println!(
        "\ninterleaved: median ns per call over {ROUNDS} rounds of {CHUNK} calls ({}):",
        if model_trace::tracepoints().is_empty() {
            "tracing compiled out"
        } else {
            "tracing compiled in"
        }
    );
    for (case, median) in Case::ALL.iter().zip(&medians) {
        println!(
            "  {:<24} {median:>9.2} ns   (+{:.2} ns over the plain twin)",
            case.name(),
            median - plain
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

fn main() {
    let input: Vec<f32> = (0..WIDTH).map(|i| (i as f32 * 0.01).sin()).collect();
    // The twins must agree, or the comparison measures different work.
    assert_eq!(layer_plain(&input), layer_annotated(&input));

    let mut criterion = Criterion::default().configure_from_args();
    criterion_cases(&mut criterion, &input);
    criterion.final_summary();
    // Only under `cargo bench`: `cargo test --benches` runs each case once, as a smoke test.
    if std::env::args().any(|arg| arg == "--bench") {
        interleaved_medians(&input);
    }
}
