//! Sessions are per thread, and a callsite caches its decision per session: threads with
//! different configurations and filters running the same traced code must each get their own
//! records; a thread without a session must cost nothing and record nothing, even while another
//! thread records; sessions may end in any order. Nesting follows the session docs: a session
//! started inside an open pass shadows the one running it until it ends, a `#[trace_model]`
//! nested in another joins the open pass, and a `#[trace_layer]` nested in another is a layer
//! call of its own, numbered in call order, that takes the stages recorded while it runs.
//!
//! Sessions are built with `Session::builder`, which reads no environment variable.
#![cfg(feature = "enabled")]

mod common;

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use model_trace::{
    trace_attention, trace_layer, trace_logits, trace_model, trace_quant, trace_tensor, Event,
    ModelTracer, ModelTracerConfig, Session, TensorError, TraceTensor,
};

use common::Events;

fn start(config: ModelTracerConfig, filter: &str) -> Session {
    Session::builder(config)
        .filter(filter)
        .start()
        .expect("an in-memory session with a valid filter starts")
}

/// Layer indices of each pass, in recording order.
fn layers_by_pass(tracer: &ModelTracer) -> Vec<Vec<usize>> {
    tracer
        .activation_traces()
        .iter()
        .map(|pass| pass.layers.iter().map(|l| l.layer_idx).collect())
        .collect()
}

fn positions(tracer: &ModelTracer) -> Vec<usize> {
    tracer
        .activation_traces()
        .iter()
        .map(|pass| pass.position)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Two threads, one callsite
// ---------------------------------------------------------------------------------------------

#[trace_attention]
fn shared_attention(x: &[f32]) -> Vec<f32> {
    let sum: f32 = x.iter().map(|v| v.abs()).sum();
    x.iter().map(|v| v.abs() / sum).collect()
}

#[trace_layer]
fn shared_block(x: &[f32]) -> Vec<f32> {
    let probs = shared_attention(x);
    x.iter().zip(&probs).map(|(a, p)| a + p).collect()
}

#[trace_model]
fn shared_model(x: &[f32]) -> Vec<f32> {
    shared_block(&shared_block(x))
}

#[test]
fn threads_with_different_configs_and_filters_share_a_callsite() {
    const ROUNDS: usize = 50;
    let barrier = Arc::new(Barrier::new(2));
    // Thread 0 records layer statistics and no attention (its config); thread 1 records
    // attention and no layer statistics (its filter). Calls alternate strictly, so each call
    // finds the callsites' cached decisions left by the other thread's session.
    let thread = |me: usize| {
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || {
            let session = match me {
                0 => start(ModelTracerConfig::lightweight(), "*"),
                _ => start(ModelTracerConfig::full(), "attention:*"),
            };
            for step in 0..2 * ROUNDS {
                if step % 2 == me {
                    shared_model(&[0.5, -1.0, 2.0]);
                }
                barrier.wait();
            }
            let (tracer, errors) = session.finish_with_errors();
            assert!(errors.is_empty(), "thread {me}: {errors:#?}");
            let layers: usize = layers_by_pass(&tracer).iter().map(Vec::len).sum();
            (
                tracer.forward_passes(),
                layers,
                tracer.attention_traces().len(),
            )
        })
    };
    let (layer_thread, attention_thread) = (thread(0), thread(1));
    let layer_thread = layer_thread.join().expect("thread 0");
    let attention_thread = attention_thread.join().expect("thread 1");
    assert_eq!(
        layer_thread,
        (ROUNDS, 2 * ROUNDS, 0),
        "thread 0: (passes, layers, attention rows)"
    );
    assert_eq!(
        attention_thread,
        (ROUNDS, 0, 2 * ROUNDS),
        "thread 1: (passes, layers, attention rows)"
    );
}

// ---------------------------------------------------------------------------------------------
// A worker thread without a session
// ---------------------------------------------------------------------------------------------

static WORKER_REFERENCE_CALLS: AtomicUsize = AtomicUsize::new(0);
static WORKER_TENSOR_READS: AtomicUsize = AtomicUsize::new(0);

/// A tensor that counts every time tracing looks at it (shape or values).
struct Counted(Vec<f32>);

impl TraceTensor for Counted {
    fn shape(&self) -> Cow<'_, [usize]> {
        WORKER_TENSOR_READS.fetch_add(1, Ordering::Relaxed);
        Cow::Owned(vec![self.0.len()])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        WORKER_TENSOR_READS.fetch_add(1, Ordering::Relaxed);
        Ok(Cow::Borrowed(&self.0))
    }
}

fn worker_exact(x: &Counted) -> Counted {
    WORKER_REFERENCE_CALLS.fetch_add(1, Ordering::Relaxed);
    Counted(x.0.iter().map(|v| v * 0.3).collect())
}

#[trace_quant(reference = worker_exact, quant = Q8_0)]
fn worker_project(x: &Counted) -> Counted {
    Counted(
        x.0.iter()
            .map(|v| (v * 0.3 * 16.0).round() / 16.0)
            .collect(),
    )
}

#[trace_logits]
fn worker_head(x: &Counted) -> Counted {
    Counted(x.0.iter().map(|v| v * 2.0).collect())
}

#[trace_layer]
fn worker_block(x: &Counted) -> Counted {
    trace_tensor!("worker_stage", x);
    let out = worker_project(x);
    worker_head(&out);
    out
}

/// Also records a stage outside any layer: an error, if it were recorded at all.
#[trace_model]
fn worker_model(x: &Counted) -> Counted {
    trace_tensor!("worker_stray", x);
    worker_block(&worker_block(x))
}

#[test]
fn a_thread_without_a_session_records_nothing_and_costs_nothing() {
    let input = Counted(vec![0.25, -1.5, 3.0, 0.5]);
    let session = start(ModelTracerConfig::full(), "");
    // The main thread's session decides every callsite first, then a worker runs the same code
    // while the session is still recording here.
    let on_main = worker_model(&input);
    let (calls, reads) = (
        WORKER_REFERENCE_CALLS.load(Ordering::Relaxed),
        WORKER_TENSOR_READS.load(Ordering::Relaxed),
    );
    assert!(calls == 2 && reads > 0, "the main thread's session records");
    let on_worker = std::thread::spawn(|| {
        assert!(!Session::is_active());
        let input = Counted(vec![0.25, -1.5, 3.0, 0.5]);
        worker_model(&input).0
    })
    .join()
    .expect("the worker does not panic");
    assert_eq!(on_worker, on_main.0, "the worker computes the same");
    assert_eq!(
        WORKER_REFERENCE_CALLS.load(Ordering::Relaxed),
        calls,
        "the worker called the quantization reference"
    );
    assert_eq!(
        WORKER_TENSOR_READS.load(Ordering::Relaxed),
        reads,
        "tracing looked at the worker's tensors"
    );
    let (tracer, errors) = session.finish_with_errors();
    // Only the main thread's own stray stage: the worker's is not this session's.
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].occurrences, 1);
    assert_eq!(tracer.forward_passes(), 1);
    assert_eq!(layers_by_pass(&tracer), [vec![0, 1]]);
    let quant: usize = tracer.quant_traces().iter().map(|q| q.traces.len()).sum();
    assert_eq!(quant, 2);
}

#[trace_layer]
fn scoped_block(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * 0.5).collect()
}

/// Runs one block here and one on a scoped worker thread, inside one pass of this thread.
#[trace_model]
fn model_with_a_worker(x: &[f32]) -> Vec<f32> {
    let here = scoped_block(x);
    let there = std::thread::scope(|scope| {
        scope
            .spawn(|| scoped_block(&[9.0, 9.0, 9.0]))
            .join()
            .expect("the worker does not panic")
    });
    assert_eq!(there, [4.5, 4.5, 4.5]);
    scoped_block(&here)
}

#[test]
fn a_worker_does_not_join_the_pass_open_on_its_parent() {
    let session = start(ModelTracerConfig::lightweight(), "");
    model_with_a_worker(&[1.0, 2.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(layers_by_pass(&tracer), [vec![0, 1]]);
    let means: Vec<f32> = tracer.activation_traces()[0]
        .layers
        .iter()
        .map(|l| l.input_stats.mean)
        .collect();
    assert_eq!(means, [1.5, 0.75], "the worker's input (9.0) is nowhere");
}

// ---------------------------------------------------------------------------------------------
// Sessions ending out of order
// ---------------------------------------------------------------------------------------------

#[trace_layer]
fn order_block(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v + 1.0).collect()
}

#[trace_model(position = position)]
fn order_model(x: &[f32], position: usize, midway: &dyn Fn()) -> Vec<f32> {
    let h = order_block(x);
    midway();
    order_block(&h)
}

#[test]
fn sessions_on_two_threads_end_in_either_order() {
    let barrier = Arc::new(Barrier::new(2));
    // Thread 0 finishes its session while thread 1 is in the middle of a pass; thread 1 goes on
    // and runs another pass after that.
    let first = {
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || {
            let session = start(ModelTracerConfig::lightweight(), "");
            order_model(&[0.0], 10, &|| {});
            barrier.wait(); // thread 1 is inside its pass
            let tracer = session.finish();
            assert!(!Session::is_active());
            barrier.wait(); // thread 0's session has ended
            (positions(&tracer), layers_by_pass(&tracer))
        })
    };
    let second = std::thread::spawn(move || {
        let session = start(ModelTracerConfig::lightweight(), "");
        order_model(&[0.0], 20, &|| {
            barrier.wait();
            barrier.wait();
        });
        assert!(Session::is_active());
        order_model(&[0.0], 21, &|| {});
        let tracer = session.finish();
        (positions(&tracer), layers_by_pass(&tracer))
    });
    let first = first.join().expect("thread 0");
    let second = second.join().expect("thread 1");
    assert_eq!(first, (vec![10], vec![vec![0, 1]]));
    assert_eq!(second, (vec![20, 21], vec![vec![0, 1], vec![0, 1]]));
}

#[test]
fn sessions_on_one_thread_end_in_either_order() {
    // "Starting a session while another is active on the thread shadows it ... Sessions may
    // end in any order."
    let older = start(ModelTracerConfig::lightweight(), "");
    order_model(&[0.0], 1, &|| {});
    let newer = start(ModelTracerConfig::lightweight(), "");
    order_model(&[0.0], 2, &|| {});
    let older = older.finish();
    assert!(Session::is_active(), "the newer session still records");
    order_model(&[0.0], 3, &|| {});
    let newer = newer.finish();
    assert!(!Session::is_active());
    order_model(&[0.0], 4, &|| {});
    assert_eq!(positions(&older), [1]);
    assert_eq!(positions(&newer), [2, 3]);
}

// ---------------------------------------------------------------------------------------------
// A session started inside an open pass
// ---------------------------------------------------------------------------------------------

#[trace_layer]
fn nest_block(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * 2.0).collect()
}

/// Three layer calls; a session of its own runs from before the second call to after it.
#[trace_model(position = 5)]
fn model_with_an_inner_session(x: &[f32], inner: &mut Option<ModelTracer>) -> Vec<f32> {
    let h = nest_block(x);
    let session = start(ModelTracerConfig::lightweight(), "");
    let h = nest_block(&h);
    *inner = Some(session.finish());
    nest_block(&h)
}

#[test]
fn a_session_started_inside_a_pass_shadows_it_until_it_ends() {
    let outer = start(ModelTracerConfig::lightweight(), "");
    let mut inner = None;
    model_with_an_inner_session(&[1.0], &mut inner);
    let outer = outer.finish();
    let inner = inner.expect("the inner session finished");

    // The outer session keeps its pass, with the two calls it saw, numbered in its own pass.
    assert_eq!(positions(&outer), [5]);
    assert_eq!(layers_by_pass(&outer), [vec![0, 1]]);
    let outer_inputs: Vec<f32> = outer.activation_traces()[0]
        .layers
        .iter()
        .map(|l| l.input_stats.mean)
        .collect();
    assert_eq!(outer_inputs, [1.0, 4.0]);
    // The inner session saw no `#[trace_model]`: its layer is in an implicit pass.
    assert_eq!(layers_by_pass(&inner), [vec![0]]);
    assert_eq!(inner.activation_traces()[0].layers[0].input_stats.mean, 2.0);
}

/// Starts a session inside the pass and leaves it running when the pass returns.
#[trace_model(position = 9)]
fn model_leaving_a_session(x: &[f32]) -> (Vec<f32>, Session) {
    let h = nest_block(x);
    let session = start(ModelTracerConfig::lightweight(), "");
    (nest_block(&h), session)
}

#[test]
fn a_session_outliving_the_pass_it_started_in_keeps_its_own_pass() {
    let outer_events = Events::default();
    let outer = Session::builder(ModelTracerConfig::lightweight())
        .sink(outer_events.clone())
        .start()
        .expect("in memory");
    let (h, inner) = model_leaving_a_session(&[1.0]);
    // The outer pass ended when the model returned, though another session records now.
    let pass_ended = outer_events
        .0
        .borrow()
        .iter()
        .any(|e| matches!(e, Event::PassEnd(end) if end.position == 9 && end.layers == 1));
    assert!(pass_ended, "the outer pass ends on return");
    nest_block(&h);
    let inner = inner.finish();
    let outer = outer.finish();
    assert_eq!(positions(&outer), [9]);
    assert_eq!(layers_by_pass(&outer), [vec![0]]);
    // The inner session: one implicit pass, unbroken by the outer pass's end.
    assert_eq!(inner.forward_passes(), 1);
    assert_eq!(layers_by_pass(&inner), [vec![0, 1]]);
}

// ---------------------------------------------------------------------------------------------
// Nested `#[trace_model]` and `#[trace_layer]`
// ---------------------------------------------------------------------------------------------

#[trace_model(position = position)]
fn inner_model(x: &[f32], position: usize) -> Vec<f32> {
    nest_block(&nest_block(x))
}

#[trace_model(position = 100)]
fn outer_model(x: &[f32]) -> Vec<f32> {
    let h = inner_model(x, 7);
    inner_model(&h, 8)
}

#[test]
fn a_model_inside_a_model_joins_its_pass() {
    // "A `#[trace_model]` nested in another joins the pass already open."
    let session = start(ModelTracerConfig::lightweight(), "");
    outer_model(&[1.0]);
    inner_model(&[1.0], 7);
    let tracer = session.finish();
    assert_eq!(tracer.forward_passes(), 2);
    assert_eq!(positions(&tracer), [100, 7]);
    assert_eq!(layers_by_pass(&tracer), [vec![0, 1, 2, 3], vec![0, 1]]);
}

#[trace_attention]
fn sub_attention(x: &[f32]) -> Vec<f32> {
    let n = x.len() as f32;
    x.iter().map(|_| 1.0 / n).collect()
}

/// A layer called inside `outer_layer`.
#[trace_layer]
fn sub_layer(x: &[f32]) -> Vec<f32> {
    trace_tensor!("inner_stage", x);
    sub_attention(x);
    x.iter().map(|v| v + 10.0).collect()
}

#[trace_layer]
fn outer_layer(x: &[f32]) -> Vec<f32> {
    trace_tensor!("before", x);
    let h = sub_layer(x);
    trace_tensor!("after", &h);
    sub_attention(&h);
    h.iter().map(|v| v * 3.0).collect()
}

#[trace_model]
fn model_of_nested_layers(x: &[f32]) -> Vec<f32> {
    let h = outer_layer(x);
    outer_layer(&h)
}

#[test]
fn a_layer_inside_a_layer_is_a_layer_call_of_its_own() {
    // Layers are numbered by call order in the pass ("the n-th layer call"); a stage or an
    // attention joins the innermost layer open when it is recorded; records are filed when a
    // layer returns ("layers in recording order"), so the inner one comes first.
    let session = start(ModelTracerConfig::full(), "");
    model_of_nested_layers(&[1.0, 3.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(layers_by_pass(&tracer), [vec![1, 0, 3, 2]]);
    let layers = &tracer.activation_traces()[0].layers;
    let stages = |at: usize| -> Vec<&str> { layers[at].stages().map(|(name, _)| name).collect() };
    // layers[0] is sub_layer (index 1), layers[1] outer_layer (index 0).
    assert_eq!(stages(0), ["input", "inner_stage", "output"]);
    assert_eq!(stages(1), ["input", "before", "after", "output"]);
    assert_eq!(layers[0].input_stats.mean, 2.0);
    assert_eq!(layers[0].output_stats.mean, 12.0);
    assert_eq!(layers[1].input_stats.mean, 2.0);
    assert_eq!(layers[1].output_stats.mean, 36.0);
    let attention_layers: Vec<usize> = tracer
        .attention_traces()
        .iter()
        .map(|t| t.layer_idx)
        .collect();
    assert_eq!(attention_layers, [1, 0, 3, 2]);
}
