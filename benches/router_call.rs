//! What `#[trace_router]` costs per router call, next to the same router without it, at the
//! sizes of a prefill chunk of real mixture-of-experts models: 512 tokens routed among 64 experts
//! (top-8, softmax: OLMoE, Qwen3-MoE-like), and among 128 experts in 8 groups, 4 chosen (top-8,
//! sigmoid with a selection bias: DeepSeek-V3-like, smaller).
//!
//! The router takes its logits as given (the gate's matmul is the model's, not tracing's) and
//! does what a router does on them: scores, the top-k per token, the weights (renormalised). The
//! twins differ only by the annotation. Cases, per shape:
//!
//! * `plain`: the unannotated twin.
//! * `annotated/no_session`: tracing compiled in, no session on the thread.
//! * `annotated/lightweight`: a [`ModelTracerConfig::lightweight`] session (in-memory tracer,
//!   which keeps every router event): the logits' summary, each token's record (runner-up,
//!   margins, `logit_margin`), the load.
//!
//! Records accumulate while a session is open, so the session is restarted every [`CALLS`]
//! calls, untimed. Criterion prints the time per call; the ratio is annotated over plain.
//! Meaningful with `--features enabled`; without it both twins are the same code.
//!
//! ```text
//! cargo bench -p model-trace --features enabled --bench router_call -- --warm-up-time 1 --measurement-time 3
//! ```

use std::borrow::Cow;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use model_trace::{trace_router, ModelTracerConfig, Session, TensorError, TraceTensor};

/// Calls per session.
const CALLS: u64 = 64;
const TOKENS: usize = 512;
const TOP_K: usize = 8;

/// A `[rows, columns]` buffer: the router's logits, weights and ids.
struct Matrix {
    values: Vec<f32>,
    shape: [usize; 2],
}

impl TraceTensor for Matrix {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Borrowed(&self.values))
    }
}

/// Scores, top-k and renormalised weights of each token: what both twins compute.
fn route(logits: &[f32], experts: usize, sigmoid: bool, bias: &[f32]) -> (Matrix, Matrix) {
    let mut weights = Vec::with_capacity(TOKENS * TOP_K);
    let mut ids = Vec::with_capacity(TOKENS * TOP_K);
    let mut order: Vec<usize> = Vec::with_capacity(experts);
    for row in logits.chunks(experts) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let scores: Vec<f32> = if sigmoid {
            row.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect()
        } else {
            row.iter().map(|l| (l - max).exp()).collect()
        };
        order.clear();
        order.extend(0..experts);
        let choose = |e: usize| scores[e] + bias.get(e).copied().unwrap_or(0.0);
        order.select_nth_unstable_by(TOP_K - 1, |&a, &b| choose(b).total_cmp(&choose(a)));
        let chosen = &order[..TOP_K];
        let sum: f32 = chosen.iter().map(|&e| scores[e]).sum();
        weights.extend(chosen.iter().map(|&e| scores[e] / sum));
        ids.extend(chosen.iter().map(|&e| e as f32));
    }
    let shape = [TOKENS, TOP_K];
    let weights = Matrix {
        values: weights,
        shape,
    };
    let ids = Matrix { values: ids, shape };
    (weights, ids)
}

struct Router {
    experts: usize,
    sigmoid: bool,
    bias: Vec<f32>,
}

impl Router {
    fn logits(&self, logits: &[f32]) -> Matrix {
        Matrix {
            values: logits.to_vec(),
            shape: [TOKENS, self.experts],
        }
    }

    #[inline(never)]
    fn plain(&self, logits: &[f32]) -> (Matrix, Matrix, Matrix) {
        let (weights, ids) = route(logits, self.experts, self.sigmoid, &self.bias);
        (self.logits(logits), weights, ids)
    }

    #[trace_router(layer = 0)]
    #[inline(never)]
    fn softmax(&self, logits: &[f32]) -> (Matrix, Matrix, Matrix) {
        let (weights, ids) = route(logits, self.experts, self.sigmoid, &self.bias);
        (self.logits(logits), weights, ids)
    }

    #[trace_router(scoring = sigmoid, bias = &self.bias, groups = (8, 4), layer = 0)]
    #[inline(never)]
    fn grouped(&self, logits: &[f32]) -> (Matrix, Matrix, Matrix) {
        let (weights, ids) = route(logits, self.experts, self.sigmoid, &self.bias);
        (self.logits(logits), weights, ids)
    }

    fn annotated(&self, logits: &[f32]) -> (Matrix, Matrix, Matrix) {
        if self.sigmoid {
            self.grouped(logits)
        } else {
            self.softmax(logits)
        }
    }
}

/// Logits of a trained-looking router: a few strong experts per token, the rest spread.
fn logits(experts: usize) -> Vec<f32> {
    let mut state = 0x2545_f491_u32;
    (0..TOKENS * experts)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 4.0 - 2.0
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Case {
    Plain,
    NoSession,
    Lightweight,
}

impl Case {
    const ALL: [Case; 3] = [Case::Plain, Case::NoSession, Case::Lightweight];

    fn name(self) -> &'static str {
        match self {
            Case::Plain => "plain",
            Case::NoSession => "annotated/no_session",
            Case::Lightweight => "annotated/lightweight",
        }
    }

    fn measure(self, router: &Router, logits: &[f32], calls: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = calls;
        while left > 0 {
            let chunk = left.min(CALLS);
            let session = matches!(self, Case::Lightweight)
                .then(|| Session::with_filter(ModelTracerConfig::lightweight(), "").unwrap());
            let start = Instant::now();
            for _ in 0..chunk {
                match self {
                    Case::Plain => black_box(router.plain(black_box(logits))),
                    _ => black_box(router.annotated(black_box(logits))),
                };
            }
            total += start.elapsed();
            if let Some(session) = session {
                let (tracer, errors) = session.finish_with_errors();
                assert!(errors.is_empty(), "{}: {errors:?}", self.name());
                assert_eq!(tracer.routers().len() as u64, chunk, "every call recorded");
            }
            left -= chunk;
        }
        total
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let shapes = [
        ("router_512x64_top8", 64, false),
        ("router_512x128_top8_groups8", 128, true),
    ];
    for (group_name, experts, sigmoid) in shapes {
        let router = Router {
            experts,
            sigmoid,
            bias: (0..experts).map(|e| (e % 7) as f32 * 0.01).collect(),
        };
        let logits = logits(experts);
        let mut group = criterion.benchmark_group(group_name);
        for case in Case::ALL {
            group.bench_function(case.name(), |b| {
                b.iter_custom(|calls| case.measure(&router, &logits, calls))
            });
        }
        group.finish();
    }
    criterion.final_summary();
}
