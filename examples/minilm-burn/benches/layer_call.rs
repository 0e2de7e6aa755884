//! What a traced layer call costs on burn, next to candle, at MiniLM's shape: a `#[trace_model]`
//! pass of 6 `#[trace_layer]` calls, each on the README sentence's hidden state `[1, 7, 384]`
//! (2,688 values).
//!
//! Each layer only adds 0 to its input (one backend op, so that the output is a new tensor of
//! the backend's), so what a case costs over the same case without a session is the tracing:
//! a layer record with the statistics of the input and the output (a
//! [`ModelTracerConfig::lightweight`] session, in memory). burn's tensors are read through a
//! device read (`try_to_data`: a copy of the values); candle's CPU tensors in place.
//!
//! Cases, per framework (`candle` on the CPU, `burn-ndarray`, `burn-flex`): `no_session`
//! (tracing compiled in, no session: one thread-local check per tracepoint) and `lightweight`.
//! Criterion times each; then the cases run again interleaved, one chunk of each per round in
//! rotating order, and the bench prints, per framework, the median excess of `lightweight`
//! over `no_session` in the same round, per layer call (the pass's begin and end spread over
//! its 6 layers), with the quartiles of that excess over the rounds, and what burn's own read of
//! one such tensor costs on each backend (two a layer call: its input and its output).
//!
//! ```text
//! cargo bench -p minilm-burn --features trace --bench layer_call -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use burn_tensor::Tensor as BurnTensor;
use candle_core::Tensor as CandleTensor;
use criterion::Criterion;
use minilm_burn::Backend;
use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session, TraceFilter};

/// The README sentence's hidden state in MiniLM: `[batch, tokens, hidden]`.
const SHAPE: [usize; 3] = [1, 7, 384];
/// MiniLM's encoder layers: layer calls per pass.
const LAYERS: usize = 6;
/// Passes per session (bounds the records a session holds).
const PASSES: u64 = 64;
/// Rounds of the interleaved measurement.
const ROUNDS: usize = 41;

#[trace_layer]
#[inline(never)]
fn candle_layer(x: &CandleTensor) -> candle_core::Result<CandleTensor> {
    x.affine(1.0, 0.0)
}

#[trace_model]
#[inline(never)]
fn candle_pass(x: &CandleTensor) -> CandleTensor {
    let mut hidden = x.clone();
    for _ in 0..LAYERS {
        hidden = candle_layer(&hidden).expect("candle op");
    }
    hidden
}

#[trace_layer]
#[inline(never)]
fn burn_layer(x: BurnTensor<3>) -> BurnTensor<3> {
    x.add_scalar(0.0)
}

#[trace_model]
#[inline(never)]
fn burn_pass(x: BurnTensor<3>) -> BurnTensor<3> {
    let mut hidden = x;
    for _ in 0..LAYERS {
        hidden = burn_layer(hidden);
    }
    hidden
}

/// One framework's input (burn's tensor handle is ~10 times the size of candle's).
enum Input {
    Candle(CandleTensor),
    Burn(String, Box<BurnTensor<3>>),
}

impl Input {
    fn all() -> Vec<Input> {
        let values: Vec<f32> = (0..SHAPE.iter().product::<usize>())
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let candle = CandleTensor::from_vec(values.clone(), &SHAPE, &candle_core::Device::Cpu)
            .expect("candle tensor");
        let mut inputs = vec![Input::Candle(candle)];
        for backend in Backend::ALL {
            let data = burn_tensor::TensorData::new(values.clone(), SHAPE);
            let tensor = BurnTensor::from_data(data, &backend.device());
            inputs.push(Input::Burn(
                format!("burn-{}", backend.name()),
                Box::new(tensor),
            ));
        }
        inputs
    }

    fn name(&self) -> &str {
        match self {
            Input::Candle(_) => "candle",
            Input::Burn(name, _) => name,
        }
    }

    /// Time of `passes` passes, in chunks of [`PASSES`], each chunk in a fresh session when
    /// `traced`.
    fn measure(&self, traced: bool, passes: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = passes;
        while left > 0 {
            let chunk = left.min(PASSES);
            let session = traced.then(|| {
                Session::with_trace_filter(ModelTracerConfig::lightweight(), TraceFilter::all())
            });
            let start = Instant::now();
            for _ in 0..chunk {
                match self {
                    Input::Candle(x) => drop(black_box(candle_pass(black_box(x)))),
                    Input::Burn(_, x) => drop(black_box(burn_pass(black_box((**x).clone())))),
                }
            }
            total += start.elapsed();
            if let Some(session) = session {
                let (tracer, errors) = session.finish_with_errors();
                assert!(errors.is_empty(), "{}: {errors:?}", self.name());
                assert_eq!(tracer.activation_traces().len() as u64, chunk);
            }
            left -= chunk;
        }
        total
    }
}

fn criterion_cases(criterion: &mut Criterion, inputs: &[Input]) {
    let mut group = criterion.benchmark_group("layer_pass_6x1x7x384");
    for input in inputs {
        for (traced, case) in [(false, "no_session"), (true, "lightweight")] {
            group.bench_function(format!("{}/{case}", input.name()), |b| {
                b.iter_custom(|passes| input.measure(traced, passes))
            });
        }
    }
    group.finish();
}

/// The median and quartiles of `values`.
fn quartiles(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    [at(0.25), at(0.5), at(0.75)]
}

fn interleaved_excess(inputs: &[Input], rounds: usize) {
    // Per framework: each round's (no_session, lightweight) ns per pass.
    let mut rounds_of: Vec<Vec<[f64; 2]>> = vec![Vec::with_capacity(rounds); inputs.len()];
    for round in 0..rounds {
        for offset in 0..inputs.len() * 2 {
            let at = (round + offset) % (inputs.len() * 2);
            let (input, traced) = (at / 2, at % 2 == 1);
            let ns = inputs[input].measure(traced, PASSES).as_nanos() as f64 / PASSES as f64;
            if rounds_of[input].len() <= round {
                rounds_of[input].push([f64::NAN; 2]);
            }
            rounds_of[input][round][usize::from(traced)] = ns;
        }
    }
    println!(
        "\nlightweight over no_session, per layer call (median of {rounds} interleaved rounds, \
         quartiles), shape {SHAPE:?}:"
    );
    println!(
        "{:<14} {:>14} {:>14} {:>26}",
        "framework", "no_session", "lightweight", "excess per layer call"
    );
    for (input, measured) in inputs.iter().zip(&rounds_of) {
        let plain = quartiles(measured.iter().map(|r| r[0]).collect())[1];
        let traced = quartiles(measured.iter().map(|r| r[1]).collect())[1];
        let excess = quartiles(
            measured
                .iter()
                .map(|r| (r[1] - r[0]) / LAYERS as f64)
                .collect(),
        );
        println!(
            "{:<14} {:>11.1} µs {:>11.1} µs {:>9.2} µs [{:.2}, {:.2}]",
            input.name(),
            plain / 1e3,
            traced / 1e3,
            excess[1] / 1e3,
            excess[0] / 1e3,
            excess[2] / 1e3
        );
    }
}

/// What burn's own read of the input costs (`try_to_data`, which every traced tensor goes
/// through), median of `rounds` rounds of 100 reads: the floor of a traced burn tensor.
fn burn_reads(inputs: &[Input], rounds: usize) {
    println!(
        "\nburn's own read of one [1, 7, 384] tensor (try_to_data), median of {rounds} rounds:"
    );
    for input in inputs {
        if let Input::Burn(name, x) = input {
            let per_read = quartiles(
                (0..rounds)
                    .map(|_| {
                        let start = Instant::now();
                        for _ in 0..100 {
                            black_box(x.try_to_data().expect("read"));
                        }
                        start.elapsed().as_nanos() as f64 / 100.0
                    })
                    .collect(),
            );
            println!("{name:<14} {:>9.2} µs", per_read[1] / 1e3);
        }
    }
}

fn main() {
    let inputs = Input::all();
    let mut criterion = Criterion::default().configure_from_args();
    criterion_cases(&mut criterion, &inputs);
    criterion.final_summary();
    // `cargo test --bench`: each case once, above; the interleaved rounds once too.
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let rounds = if benchmarking { ROUNDS } else { 1 };
    interleaved_excess(&inputs, rounds);
    burn_reads(&inputs, rounds);
}
