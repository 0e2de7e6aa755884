//! The thread-local state behind [`Session`](super::Session) and the hooks in `__private`.
//!
//! Two thread-locals: the generation of the active session in a `Cell<u32>` (the only thing
//! the fast path reads), and the stack of sessions in a `RefCell`, borrowed only by hooks of
//! tracepoints that are active. A hook never holds the borrow while it calls into tensor code,
//! so a user `TraceTensor` that itself reaches a tracepoint cannot cause a double borrow.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{RecordError, TraceFilter};
use crate::__private::Callsite;
use crate::activation::LayerActivationTrace;
use crate::registry::{Tracepoint, TracepointKind};
use crate::stats::TensorStats;
use crate::tracer::{ModelTracer, ModelTracerConfig};

thread_local! {
    /// Generation of the session recording on this thread; 0 when none.
    static ACTIVE_GENERATION: Cell<u32> = const { Cell::new(0) };
    /// Sessions started on this thread and not yet ended, oldest first.
    static SESSIONS: RefCell<Vec<SessionState>> = const { RefCell::new(Vec::new()) };
}

/// Generations are unique across threads, so a callsite's cached decision, keyed by
/// generation, can never be mistaken for another session's.
static NEXT_GENERATION: AtomicU32 = AtomicU32::new(1);

/// Distinct error messages kept per session; a tracepoint failing on every call with a new
/// shape must not grow memory without bound.
const MAX_ERRORS: usize = 256;

/// Decision bit: the tracepoint's hook runs (for `model` and `layer`: keeps the structure).
pub(crate) const RUN: u8 = 1;
/// Decision bit: the tracepoint records its values.
pub(crate) const RECORD: u8 = 2;

#[inline(always)]
pub(crate) fn active_generation() -> u32 {
    ACTIVE_GENERATION.with(Cell::get)
}

/// Runs `f` on the session with `generation`, if it is still alive on this thread and the
/// state is not already borrowed (it never is, unless a hook is re-entered from tensor code).
pub(crate) fn with_session<R>(
    generation: u32,
    f: impl FnOnce(&mut SessionState) -> R,
) -> Option<R> {
    if generation == 0 {
        return None;
    }
    SESSIONS
        .try_with(|sessions| {
            let mut sessions = sessions.try_borrow_mut().ok()?;
            let session = sessions
                .iter_mut()
                .rev()
                .find(|session| session.generation == generation)?;
            Some(f(session))
        })
        .ok()
        .flatten()
}

/// [`with_session`] on the session recording on this thread.
pub(crate) fn with_active<R>(f: impl FnOnce(&mut SessionState) -> R) -> Option<R> {
    with_session(active_generation(), f)
}

#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
pub(crate) fn push(config: ModelTracerConfig, filter: TraceFilter) -> u32 {
    let generation = loop {
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        if generation != 0 {
            break generation;
        }
    };
    let state = SessionState::new(generation, config, filter);
    let pushed = SESSIONS
        .try_with(|sessions| match sessions.try_borrow_mut() {
            Ok(mut sessions) => {
                sessions.push(state);
                true
            }
            Err(_) => false,
        })
        .unwrap_or(false);
    if pushed {
        ACTIVE_GENERATION.with(|active| active.set(generation));
        generation
    } else {
        0
    }
}

pub(crate) fn remove(generation: u32) -> Option<SessionState> {
    if generation == 0 {
        return None;
    }
    SESSIONS
        .try_with(|sessions| {
            let mut sessions = sessions.try_borrow_mut().ok()?;
            let at = sessions.iter().position(|s| s.generation == generation)?;
            let removed = sessions.remove(at);
            let now_active = sessions.last().map_or(0, |s| s.generation);
            ACTIVE_GENERATION.with(|active| active.set(now_active));
            Some(removed)
        })
        .ok()
        .flatten()
}

/// Decision bits ([`RUN`], [`RECORD`]) for `callsite` in the session with `generation`;
/// `None` when the state cannot be read right now (borrowed by a hook further up the stack).
pub(crate) fn decide(generation: u32, callsite: &'static Callsite) -> Option<u8> {
    let decided = with_session(generation, |session| {
        let key = std::ptr::from_ref(callsite) as usize;
        let SessionState {
            decisions,
            tracer,
            filter,
            ..
        } = session;
        *decisions
            .entry(key)
            .or_insert_with(|| decision(tracer.config(), filter, callsite.tracepoint()))
    });
    if decided.is_some() {
        return decided;
    }
    let borrowed = SESSIONS
        .try_with(|sessions| sessions.try_borrow_mut().is_err())
        .unwrap_or(false);
    // Not borrowed: the session is gone, and "inactive" is the right answer to cache.
    (!borrowed).then_some(0)
}

fn decision(config: &ModelTracerConfig, filter: &TraceFilter, tracepoint: &Tracepoint) -> u8 {
    let admitted = filter.admits(tracepoint);
    let records = |on: bool| if on && admitted { RUN | RECORD } else { 0 };
    match tracepoint.kind {
        TracepointKind::Model => {
            if config.is_enabled() {
                RUN
            } else {
                0
            }
        }
        TracepointKind::Layer => {
            // A layer the filter drops still runs (numbering, enclosing index) when something
            // recorded inside it may be admitted; otherwise it costs a load and a branch.
            let may = |on: bool, kind| on && filter.may_admit_kind(kind);
            let needs_context = may(config.trace_activations, TracepointKind::Tensor)
                || may(config.trace_activations, TracepointKind::Layer)
                || may(config.trace_attention, TracepointKind::Attention)
                || may(config.trace_logits, TracepointKind::Logits)
                || may(config.trace_quant_error, TracepointKind::Quant);
            match (needs_context, config.trace_activations && admitted) {
                (false, _) => 0,
                (true, false) => RUN,
                (true, true) => RUN | RECORD,
            }
        }
        TracepointKind::Tensor => records(config.trace_activations),
        TracepointKind::Attention => records(config.trace_attention),
        TracepointKind::Logits => records(config.trace_logits),
        TracepointKind::KvCache => records(config.trace_kv_cache),
        TracepointKind::Quant => records(config.trace_quant_error),
    }
}

/// One session's recorder plus the context that attributes records to passes and layers.
pub(crate) struct SessionState {
    pub(crate) generation: u32,
    pub(crate) tracer: ModelTracer,
    pub(crate) errors: Vec<RecordError>,
    filter: TraceFilter,
    /// Callsite address -> decision bits; the callsite's own one-entry cache thrashes when
    /// sessions on several threads run the same code, and this keeps the miss cheap.
    decisions: HashMap<usize, u8>,
    pass: Option<Pass>,
    passes_begun: usize,
    layers: Vec<LayerFrame>,
    next_frame_id: u64,
    kv_steps: usize,
}

/// The forward pass in progress.
struct Pass {
    id: usize,
    /// Opened by `#[trace_model]` (else implicitly by a layer or logits outside any).
    explicit: bool,
    /// Layer calls so far: the index of the next auto-numbered layer.
    layer_calls: usize,
    /// One past the highest layer index seen: the layer of logits outside any layer.
    layers_seen: usize,
}

/// A layer call in progress.
struct LayerFrame {
    id: u64,
    index: usize,
    record: bool,
    /// A stage was recorded into it (possibly while the layer itself is filtered out).
    has_stages: bool,
    /// Its `set_stage` recomputes the residual ratio once input and output are both in.
    trace: LayerActivationTrace,
}

impl SessionState {
    fn new(generation: u32, config: ModelTracerConfig, filter: TraceFilter) -> Self {
        Self {
            generation,
            tracer: ModelTracer::new(config),
            errors: Vec::new(),
            filter,
            decisions: HashMap::new(),
            pass: None,
            passes_begun: 0,
            layers: Vec::new(),
            next_frame_id: 0,
            kv_steps: 0,
        }
    }

    /// Closes what is still open, so that a session finished inside a pass keeps it.
    #[cfg_attr(not(feature = "enabled"), allow(dead_code))]
    pub(crate) fn into_results(mut self) -> (ModelTracer, Vec<RecordError>) {
        self.close_pass();
        (self.tracer, self.errors)
    }

    pub(crate) fn note_error(&mut self, tracepoint: Option<&'static Tracepoint>, message: String) {
        let same = |e: &&mut RecordError| {
            e.message == message
                && match (e.tracepoint, tracepoint) {
                    (Some(a), Some(b)) => std::ptr::eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        };
        if let Some(existing) = self.errors.iter_mut().find(same) {
            existing.occurrences += 1;
        } else if self.errors.len() < MAX_ERRORS {
            self.errors.push(RecordError {
                tracepoint,
                message,
                occurrences: 1,
            });
        }
    }

    /// Begins a pass for `#[trace_model]`; `None` when one is already open (the nested call
    /// joins it). An implicit pass is closed first.
    pub(crate) fn begin_model_pass(&mut self, position: Option<usize>) -> Option<usize> {
        if self.pass.as_ref().is_some_and(|pass| pass.explicit) {
            return None;
        }
        self.close_pass();
        Some(self.begin_pass(position, true))
    }

    pub(crate) fn end_model_pass(&mut self, id: usize) {
        if self.pass.as_ref().is_some_and(|pass| pass.id == id) {
            self.close_pass();
        }
    }

    fn begin_pass(&mut self, position: Option<usize>, explicit: bool) -> usize {
        let pass = self.start_pass(position, explicit);
        self.pass.insert(pass).id
    }

    fn start_pass(&mut self, position: Option<usize>, explicit: bool) -> Pass {
        let id = self.passes_begun;
        self.passes_begun += 1;
        self.tracer.begin_forward(position.unwrap_or(id));
        Pass {
            id,
            explicit,
            layer_calls: 0,
            layers_seen: 0,
        }
    }

    fn ensure_pass(&mut self) -> &mut Pass {
        let pass = match self.pass.take() {
            Some(pass) => pass,
            None => self.start_pass(None, false),
        };
        self.pass.insert(pass)
    }

    fn close_pass(&mut self) {
        self.close_layers_from(0);
        if self.pass.take().is_some() {
            // The anomaly description stays in the activation trace; nothing to do with it here.
            let _ = self.tracer.end_forward();
        }
    }

    /// Opens a layer frame and returns its id for the guard.
    pub(crate) fn enter_layer(
        &mut self,
        tracepoint: &'static Tracepoint,
        index: Option<usize>,
        record: bool,
        input: Option<Result<TensorStats, String>>,
    ) -> u64 {
        let pass = self.ensure_pass();
        let index = index.unwrap_or(pass.layer_calls);
        pass.layer_calls += 1;
        pass.layers_seen = pass.layers_seen.max(index.saturating_add(1));
        let id = self.next_frame_id;
        self.next_frame_id += 1;
        let mut frame = LayerFrame {
            id,
            index,
            record,
            has_stages: false,
            trace: LayerActivationTrace::new(index),
        };
        match input {
            Some(Ok(stats)) => frame.trace.set_stage("input", stats),
            Some(Err(message)) => {
                self.note_error(Some(tracepoint), format!("layer input: {message}"))
            }
            None => {}
        }
        self.layers.push(frame);
        id
    }

    pub(crate) fn set_layer_output(&mut self, frame_id: u64, stats: TensorStats) {
        if let Some(frame) = self.layers.iter_mut().rev().find(|f| f.id == frame_id) {
            frame.trace.set_stage("output", stats);
        }
    }

    /// Closes the frame `frame_id` and any frame left open inside it.
    pub(crate) fn exit_layer(&mut self, frame_id: u64) {
        if let Some(at) = self.layers.iter().rposition(|f| f.id == frame_id) {
            self.close_layers_from(at);
        }
    }

    fn close_layers_from(&mut self, depth: usize) {
        while self.layers.len() > depth {
            let Some(frame) = self.layers.pop() else {
                break;
            };
            if !(frame.record || frame.has_stages) {
                continue;
            }
            self.tracer.record_layer_activation(frame.trace);
        }
    }

    /// Whether a stage recorded now would have a layer to join.
    pub(crate) fn in_layer(&self) -> bool {
        !self.layers.is_empty()
    }

    pub(crate) fn record_stage(&mut self, stage: &str, stats: TensorStats) -> bool {
        match self.layers.last_mut() {
            Some(frame) => {
                frame.trace.set_stage(stage, stats);
                frame.has_stages = true;
                true
            }
            None => false,
        }
    }

    /// The innermost open layer's index.
    pub(crate) fn enclosing_layer(&self) -> Option<usize> {
        self.layers.last().map(|frame| frame.index)
    }

    /// The layer of a value outside any layer: one past the last layer of this pass (0 with no
    /// pass open).
    pub(crate) fn final_layer(&self) -> usize {
        self.pass.as_ref().map_or(0, |pass| pass.layers_seen)
    }

    /// Opens an implicit pass if none is open: logits are only kept inside a pass.
    pub(crate) fn open_pass(&mut self) {
        self.ensure_pass();
    }

    pub(crate) fn next_kv_step(&mut self) -> usize {
        let step = self.kv_steps;
        self.kv_steps += 1;
        step
    }
}
