//! The thread-local state behind [`Session`](super::Session) and the hooks in `__private`: the
//! one owner of the pass and layer context, which turns what hooks read into events and hands
//! them to the session's sinks.
//!
//! Two thread-locals: the generation of the active session in a `Cell<u32>` (the only thing
//! the fast path reads), and the stack of sessions in a `RefCell`, borrowed only by hooks of
//! tracepoints that are active. A hook never holds the borrow while it calls into tensor code,
//! so a user `TraceTensor` that itself reaches a tracepoint cannot cause a double borrow.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use super::clock;
use super::errors::{ErrorBook, RecordError};
use crate::analysis::PassRecorder;
use crate::config::{DigestPolicy, ModelTracerConfig};
use crate::format::CaptureWriter;
use crate::intervene::{self, Intervention, InterventionSite};
use crate::record::RecordErrorKind;
use crate::record::{
    labels, ErrorCount, ErrorEvent, Event, InterventionEvent, LayerActivationTrace, LayerEvent,
    PassBegin, PassEnd, SessionEnd, StageEvent, TraceHeader,
};
use crate::select::{CaptureFilter, TraceFilter};
use crate::sink::{LayerBegin, LayerEnd, ModelTracer, SinkError, TraceSink};
use crate::stats::TensorStats;
use crate::summary::TensorSummary;
use crate::tensor::{PendingSummary, TokensError, TraceTensor};
use crate::tracepoint::callsite::{Callsite, Interest};
use crate::tracepoint::{Tracepoint, TracepointKind};

thread_local! {
    /// Generation of the session recording on this thread; 0 when none.
    static ACTIVE_GENERATION: Cell<u32> = const { Cell::new(0) };
    /// Sessions started on this thread and not yet ended, oldest first.
    static SESSIONS: RefCell<Vec<SessionState>> = const { RefCell::new(Vec::new()) };
}

/// Generations are unique across threads, so a callsite's cached decision, keyed by
/// generation, can never be mistaken for another session's.
static NEXT_GENERATION: AtomicU32 = AtomicU32::new(1);

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

/// Makes `state` the active session of this thread; its generation, or 0 if the state could
/// not be stored (a hook is running).
#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
pub(crate) fn push(mut state: SessionState) -> u32 {
    let generation = loop {
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        if generation != 0 {
            break generation;
        }
    };
    state.generation = generation;
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
            ACTIVE_GENERATION.with(|active| active.set(recording(&sessions)));
            Some(removed)
        })
        .ok()
        .flatten()
}

/// The generation that records on this thread: the newest session's, unless it is suspended.
fn recording(sessions: &[SessionState]) -> u32 {
    sessions
        .last()
        .filter(|session| session.suspended == 0)
        .map_or(0, |session| session.generation)
}

/// Suspends the session `generation` while a forward pass that its filter leaves out runs:
/// until [`resume`], tracepoints on this thread see no session. `false` when it is not there.
pub(crate) fn suspend(generation: u32) -> bool {
    set_suspended(generation, |depth| depth + 1)
}

/// Ends one [`suspend`] of the session `generation`.
pub(crate) fn resume(generation: u32) {
    set_suspended(generation, |depth| depth.saturating_sub(1));
}

fn set_suspended(generation: u32, change: impl FnOnce(usize) -> usize) -> bool {
    SESSIONS
        .try_with(|sessions| {
            let Ok(mut sessions) = sessions.try_borrow_mut() else {
                return false;
            };
            let Some(session) = sessions.iter_mut().find(|s| s.generation == generation) else {
                return false;
            };
            session.suspended = change(session.suspended);
            ACTIVE_GENERATION.with(|active| active.set(recording(&sessions)));
            true
        })
        .unwrap_or(false)
}

/// What the session with `generation` wants of `callsite`; `None` when the state cannot be
/// read right now (borrowed by a hook further up the stack).
pub(crate) fn decide(generation: u32, callsite: &'static Callsite) -> Option<Interest> {
    let decided = with_session(generation, |session| {
        let key = std::ptr::from_ref(callsite) as usize;
        let SessionState {
            decisions,
            config,
            filter,
            ..
        } = session;
        *decisions
            .entry(key)
            .or_insert_with(|| interest(config, filter, callsite.tracepoint()))
    });
    if decided.is_some() {
        return decided;
    }
    let borrowed = SESSIONS
        .try_with(|sessions| sessions.try_borrow_mut().is_err())
        .unwrap_or(false);
    // Not borrowed: the session is gone, and "never" is the right answer to cache.
    (!borrowed).then_some(Interest::Never)
}

fn interest(config: &ModelTracerConfig, filter: &TraceFilter, tracepoint: &Tracepoint) -> Interest {
    let admitted = filter.admits(tracepoint);
    let records = |on: bool| {
        if on && admitted {
            Interest::Record
        } else {
            Interest::Never
        }
    };
    match tracepoint.kind {
        TracepointKind::Model => match (config.is_enabled(), filter.traces_pass(tracepoint)) {
            (false, _) => Interest::Never,
            (true, true) => Interest::Structure,
            (true, false) => Interest::Suspend,
        },
        TracepointKind::Layer => {
            // A layer the filter drops still runs (numbering, enclosing index) when something
            // recorded inside it may be admitted; otherwise it costs a load and a branch.
            let may = |on: bool, kind| on && filter.may_admit_kind(kind);
            let needs_context = may(config.trace_activations, TracepointKind::Tensor)
                || may(config.trace_activations, TracepointKind::Layer)
                || may(config.trace_attention, TracepointKind::Attention)
                || may(config.trace_logits, TracepointKind::Logits)
                || may(config.trace_quant_error, TracepointKind::Quant)
                || may(config.trace_kv_cache, TracepointKind::KvCache);
            match (needs_context, config.trace_activations && admitted) {
                (false, _) => Interest::Never,
                (true, false) => Interest::Structure,
                (true, true) => Interest::Record,
            }
        }
        TracepointKind::Tensor => {
            if !config.trace_activations {
                Interest::Never
            } else if admitted {
                Interest::Record
            } else if !filter.excludes(tracepoint) && filter.may_admit_kind(TracepointKind::Layer) {
                Interest::InRecordedLayer
            } else {
                Interest::Never
            }
        }
        TracepointKind::Attention => records(config.trace_attention),
        TracepointKind::Logits => records(config.trace_logits),
        TracepointKind::KvCache => records(config.trace_kv_cache),
        TracepointKind::Quant => records(config.trace_quant_error),
    }
}

/// Applies the interventions of the active session that select `stage` of `cs`'s tracepoint
/// at `layer` to `tensor` (`None`: the value is not a tensor that can be changed), and writes
/// an event for each change. The session is not borrowed while the tensor is read, changed and
/// rebuilt. What cannot be done is an error of the tracepoint, never skipped silently.
pub(crate) fn intervene(
    generation: u32,
    cs: &'static Callsite,
    layer: Option<usize>,
    stage: &str,
    tensor: Option<&mut dyn TraceTensor>,
) {
    let tracepoint = cs.tracepoint();
    let Some((selected, pass_position)) = with_session(generation, |s| {
        s.has_interventions()
            .then(|| s.interventions_for(tracepoint, layer, stage))
    })
    .flatten() else {
        return;
    };
    if selected.is_empty() {
        return;
    }
    let Some(tensor) = tensor else {
        let text = selected[0].1.to_string();
        cs.note_error(
            RecordErrorKind::Intervention,
            format!(
                "intervention `{text}` selects `{stage}` here, which cannot be changed: not an \
                 owned tensor (an `impl` or generic parameter, an `input = EXPR` that is no \
                 parameter, an output borrowed from the input)"
            ),
        );
        return;
    };
    let pass = with_session(generation, |s| s.pass_id()).flatten();
    let shape = tensor.shape().into_owned();
    let site = InterventionSite {
        pass,
        layer,
        stage,
        shape: &shape,
    };
    for (index, intervention) in selected {
        let outcome = intervene::apply(&intervention, tensor, &site, pass_position);
        if !matches!(outcome, Ok(None)) {
            // Its `position=` rows outside this tensor's: not counted, so that one that never
            // reaches a row is warned about at the end.
            with_session(generation, |s| s.count_selection(index));
        }
        match outcome {
            Ok(Some(applied)) => {
                with_session(generation, |s| {
                    s.record_intervention(index, tracepoint, layer, stage, applied);
                });
            }
            Ok(None) => {}
            Err(reason) => cs.note_error(
                RecordErrorKind::Intervention,
                format!("intervention `{intervention}` on `{stage}`: {reason}"),
            ),
        }
    }
}

/// What a session needs to be set up: everything the builder gathered.
pub(crate) struct SessionSetup {
    pub(crate) config: ModelTracerConfig,
    pub(crate) filter: TraceFilter,
    pub(crate) keep_in_memory: bool,
    pub(crate) sinks: Vec<Box<dyn TraceSink>>,
    pub(crate) capture: Option<(CaptureFilter, CaptureWriter)>,
    pub(crate) header: TraceHeader,
    /// Errors found while setting up (an unusable `MODEL_TRACE`), reported as the session's.
    pub(crate) setup_errors: Vec<(RecordErrorKind, String)>,
    pub(crate) interventions: Vec<Intervention>,
}

/// A sink and whether it is still running.
struct SinkSlot {
    sink: Box<dyn TraceSink>,
    stopped: bool,
}

/// How to read one tensor: with a digest or not, and whether to save it in full.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorPlan {
    pub(crate) digest: DigestPolicy,
    pub(crate) capture: bool,
    /// [`ModelTracerConfig::device_copy_below`].
    pub(crate) copy_below: usize,
}

/// A tensor of a layer as a hook read it: its summary, or a read that the end of the pass
/// finishes (a device's, see [`TraceTensor::start_summary`](crate::TraceTensor::start_summary)).
pub(crate) enum StageRead {
    Now(TensorSummary),
    /// The summary's shape and dtype, and the read that fills in the rest.
    Later(TensorSummary, PendingSummary, &'static Tracepoint),
}

/// The reads of the open pass that its end finishes, and the events held back until then, so
/// that they reach the sinks complete and in order.
#[derive(Default)]
struct Deferred {
    /// The sequence number of the stage each read fills in (increasing), the read, and the
    /// tracepoint that asked for it.
    reads: Vec<(u64, PendingSummary, &'static Tracepoint)>,
    held: Vec<Event>,
}

impl Deferred {
    /// The summary to record for the stage `seq` now: the read's own, or the placeholder of a
    /// read kept for the end of the pass.
    fn take(&mut self, seq: u64, read: StageRead) -> TensorSummary {
        match read {
            StageRead::Now(summary) => summary,
            StageRead::Later(placeholder, read, tracepoint) => {
                self.reads.push((seq, read, tracepoint));
                placeholder
            }
        }
    }
}

/// One session's context and its sinks.
pub(crate) struct SessionState {
    pub(crate) generation: u32,
    pub(crate) config: ModelTracerConfig,
    filter: TraceFilter,
    /// Callsite address -> decision bits; the callsite's own one-entry cache thrashes when
    /// sessions on several threads run the same code, and this keeps the miss cheap.
    decisions: HashMap<usize, Interest>,
    /// Keeps the records, or only the summary (see [`SessionBuilder::in_memory`]).
    ///
    /// [`SessionBuilder::in_memory`]: super::SessionBuilder::in_memory
    memory: ModelTracer,
    sinks: Vec<SinkSlot>,
    errors: ErrorBook,
    /// The effective digest policy: `Off` unless a sink keeps digests.
    digest: DigestPolicy,
    capture: Option<(CaptureFilter, CaptureWriter)>,
    next_seq: u64,
    pass: Option<Pass>,
    passes_begun: usize,
    recorder: PassRecorder,
    layers: Vec<LayerFrame>,
    next_frame_id: u64,
    deferred: Deferred,
    /// Steps recorded per cache (by layer), to number each cache's steps.
    kv_steps: Vec<(Option<usize>, usize)>,
    /// Passes left out by the filter that are running now (see [`suspend`]).
    suspended: usize,
    /// Whether the implicit pass was warned about.
    implicit_pass_warned: bool,
    /// The interventions, each with the number of tensors it selected.
    interventions: Vec<(Intervention, usize)>,
    ended: bool,
}

/// The forward pass in progress.
struct Pass {
    id: usize,
    position: usize,
    /// Opened by `#[trace_model]` (else implicitly by a record outside any).
    explicit: bool,
    /// Layer calls so far: the index of the next auto-numbered layer.
    layer_calls: usize,
    /// One past the highest layer index seen: the layer of logits outside any layer.
    layers_seen: usize,
    start_ns: u64,
}

/// A layer call in progress.
struct LayerFrame {
    id: u64,
    seq: u64,
    index: usize,
    record: bool,
    tracepoint: &'static Tracepoint,
    start_ns: u64,
    /// `input`, the stages so far, and at the end `output`.
    stages: Vec<StageEvent>,
}

impl SessionState {
    /// A session from its setup; the sinks have been started with the header.
    pub(crate) fn new(setup: SessionSetup) -> Self {
        let SessionSetup {
            config,
            filter,
            keep_in_memory,
            sinks,
            capture,
            header,
            setup_errors,
            interventions,
        } = setup;
        let wants_digests = sinks.iter().any(|sink| sink.wants_digests());
        let digest = if wants_digests {
            config.digests
        } else {
            DigestPolicy::Off
        };
        let mut state = Self {
            generation: 0,
            memory: if keep_in_memory {
                ModelTracer::new(config.clone())
            } else {
                ModelTracer::summary_only(config.clone())
            },
            config,
            filter,
            decisions: HashMap::new(),
            sinks: sinks
                .into_iter()
                .map(|sink| SinkSlot {
                    sink,
                    stopped: false,
                })
                .collect(),
            errors: ErrorBook::default(),
            digest,
            capture,
            next_seq: 0,
            pass: None,
            passes_begun: 0,
            recorder: PassRecorder::default(),
            layers: Vec::new(),
            next_frame_id: 0,
            deferred: Deferred::default(),
            kv_steps: Vec::new(),
            suspended: 0,
            implicit_pass_warned: false,
            interventions: interventions.into_iter().map(|i| (i, 0)).collect(),
            ended: false,
        };
        state.for_each_sink(|sink| sink.start(&header));
        for (kind, message) in setup_errors {
            state.note_error(None, kind, message);
        }
        state
    }

    fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Hands `event` to every sink that is still running, or holds it while the pass has reads
    /// that its end finishes.
    pub(crate) fn emit(&mut self, event: Event) {
        if self.deferred.reads.is_empty() {
            self.deliver(&event);
        } else {
            self.deferred.held.push(event);
        }
    }

    fn deliver(&mut self, event: &Event) {
        self.memory.accept(event);
        self.for_each_sink(|sink| sink.event(event));
    }

    /// Calls `call` on each running sink; a sink that fails is stopped and its error noted.
    fn for_each_sink(&mut self, mut call: impl FnMut(&mut dyn TraceSink) -> Result<(), SinkError>) {
        let mut failures = Vec::new();
        for slot in self.sinks.iter_mut().filter(|slot| !slot.stopped) {
            if let Err(error) = call(slot.sink.as_mut()) {
                slot.stopped = true;
                failures.push(format!("{} stopped: {error}", slot.sink.name()));
            }
        }
        for message in failures {
            self.note_error(None, RecordErrorKind::Sink, message);
        }
    }

    /// Counts an error or a warning; its first occurrence becomes an error event, and a
    /// warning's first occurrence is also printed on stderr.
    pub(crate) fn note_error(
        &mut self,
        tracepoint: Option<&'static Tracepoint>,
        kind: RecordErrorKind,
        message: String,
    ) {
        if !self.errors.note(tracepoint, kind, &message) {
            return;
        }
        if kind.is_warning() {
            let warning = RecordError {
                tracepoint,
                kind,
                message: message.clone(),
                occurrences: 1,
            };
            eprintln!("model-trace: warning: {warning}");
        }
        let (tracepoint, function) = labels(tracepoint);
        let event = Event::Error(ErrorEvent {
            seq: self.next_seq(),
            pass: self.pass.as_ref().map(|pass| pass.id),
            layer: self.enclosing_layer(),
            tracepoint,
            function,
            kind,
            message,
        });
        self.emit(event);
    }

    /// Occurrences of distinct errors past [`MAX_DISTINCT_ERRORS`](super::MAX_DISTINCT_ERRORS),
    /// counted but not kept.
    pub(crate) fn errors_not_kept(&self) -> usize {
        self.errors.overflow
    }

    /// The errors so far (not the warnings).
    pub(crate) fn errors(&self) -> Vec<RecordError> {
        self.problems(false)
    }

    /// The warnings so far.
    pub(crate) fn warnings(&self) -> Vec<RecordError> {
        self.problems(true)
    }

    fn problems(&self, warnings: bool) -> Vec<RecordError> {
        self.errors
            .all()
            .iter()
            .filter(|error| error.kind.is_warning() == warnings)
            .cloned()
            .collect()
    }

    // -----------------------------------------------------------------------------------------
    // Passes
    // -----------------------------------------------------------------------------------------

    /// Begins a pass for `#[trace_model]`; `None` when one is already open (the nested call
    /// joins it). An implicit pass is closed first. Token ids that could not be read leave the
    /// pass without its `tokens`, and are an error of the pass.
    pub(crate) fn begin_model_pass(
        &mut self,
        tracepoint: &'static Tracepoint,
        position: Option<usize>,
        tokens: Option<Result<Vec<u32>, TokensError>>,
    ) -> Option<usize> {
        if self.pass.as_ref().is_some_and(|pass| pass.explicit) {
            return None;
        }
        self.close_pass();
        let (tokens, error) = match tokens {
            Some(Ok(ids)) => (Some(ids), None),
            Some(Err(error)) => (None, Some(error)),
            None => (None, None),
        };
        let id = self.begin_pass(Some(tracepoint), position, tokens).id;
        if let Some(error) = error {
            let kind = match error {
                TokensError::Rank { .. } => RecordErrorKind::Shape,
                _ => RecordErrorKind::Read,
            };
            self.note_error(Some(tracepoint), kind, format!("tokens: {error}"));
        }
        Some(id)
    }

    pub(crate) fn end_model_pass(&mut self, id: usize) {
        if self.pass.as_ref().is_some_and(|pass| pass.id == id) {
            self.close_pass();
        }
    }

    fn begin_pass(
        &mut self,
        tracepoint: Option<&'static Tracepoint>,
        position: Option<usize>,
        tokens: Option<Vec<u32>>,
    ) -> &mut Pass {
        let id = self.passes_begun;
        self.passes_begun += 1;
        let position = position.unwrap_or(id);
        let start_ns = clock::now_ns();
        self.recorder.begin(position);
        let (tracepoint_label, function) = labels(tracepoint);
        let event = Event::PassBegin(PassBegin {
            seq: self.next_seq(),
            pass: id,
            position,
            tracepoint: tracepoint_label,
            function,
            start_ns,
            tokens,
        });
        self.emit(event);
        self.pass.insert(Pass {
            id,
            position,
            explicit: tracepoint.is_some(),
            layer_calls: 0,
            layers_seen: 0,
            start_ns,
        })
    }

    /// The open pass's id, opening an implicit pass when none is open: the first time, with a
    /// warning naming `cause`, the tracepoint that needed a pass.
    fn ensure_pass(&mut self, cause: &'static Tracepoint) -> usize {
        if let Some(pass) = &self.pass {
            return pass.id;
        }
        let id = self.begin_pass(None, None, None).id;
        if !self.implicit_pass_warned {
            self.implicit_pass_warned = true;
            let what = match cause.kind {
                TracepointKind::Logits => "logits",
                _ => "layers",
            };
            let message = format!(
                "{what} recorded outside any #[trace_model] function: they are counted as one \
                 implicit pass; annotate the forward function with #[trace_model]"
            );
            self.note_error(Some(cause), RecordErrorKind::ImplicitPass, message);
        }
        id
    }

    fn close_pass(&mut self) {
        self.close_layers_from(0);
        if self.pass.is_none() {
            return;
        }
        self.finish_deferred();
        let Some(pass) = self.pass.take() else {
            return;
        };
        let (anomalies, logits) = self.recorder.finish(&self.config);
        let event = Event::PassEnd(PassEnd {
            seq: self.next_seq(),
            pass: pass.id,
            position: pass.position,
            duration_ns: clock::now_ns().saturating_sub(pass.start_ns),
            layers: pass.layer_calls,
            anomalies,
            logit_evolution: logits,
        });
        self.emit(event);
    }

    /// Finishes the pass's deferred reads, in the order they started (a device is waited for
    /// once, by the first), fills their stages in and hands the held events on, in order. A read
    /// that fails leaves its stage out of the layer's record, and says so.
    fn finish_deferred(&mut self) {
        if self.deferred.reads.is_empty() {
            return;
        }
        let Deferred { reads, held } = std::mem::take(&mut self.deferred);
        let mut done: Vec<_> = reads
            .into_iter()
            .map(|(seq, read, tracepoint)| (seq, Some(read.finish()), tracepoint))
            .collect();
        let mut failures = Vec::new();
        for mut event in held {
            if let Event::Layer(layer) = &mut event {
                let index = layer.layer;
                layer.stages.retain_mut(|stage| {
                    let Ok(at) = done.binary_search_by_key(&stage.seq, |(seq, _, _)| *seq) else {
                        return true;
                    };
                    match done[at].1.take() {
                        Some(Ok(summary)) => {
                            stage.tensor = summary;
                            true
                        }
                        Some(Err(error)) => {
                            let message = format!("{} of layer {index}: {error}", stage.name);
                            failures.push((done[at].2, message));
                            false
                        }
                        None => true,
                    }
                });
                if self.config.trace_activations {
                    self.recorder
                        .add_layer(LayerActivationTrace::from_event(layer));
                }
            }
            self.deliver(&event);
        }
        for (tracepoint, message) in failures {
            self.note_error(Some(tracepoint), RecordErrorKind::Read, message);
        }
    }

    /// The current pass, opened implicitly for `cause` if none is: logits are kept only inside
    /// a pass.
    pub(crate) fn open_pass(&mut self, cause: &'static Tracepoint) -> usize {
        self.ensure_pass(cause)
    }

    pub(crate) fn pass_id(&self) -> Option<usize> {
        self.pass.as_ref().map(|pass| pass.id)
    }

    // -----------------------------------------------------------------------------------------
    // Layers
    // -----------------------------------------------------------------------------------------

    /// Opens a layer frame; returns its id for the guard and its index.
    pub(crate) fn enter_layer(
        &mut self,
        tracepoint: &'static Tracepoint,
        index: Option<usize>,
        record: bool,
    ) -> (u64, usize) {
        let pass_id = self.ensure_pass(tracepoint);
        let index = match &mut self.pass {
            Some(pass) => {
                let index = index.unwrap_or(pass.layer_calls);
                pass.layer_calls += 1;
                pass.layers_seen = pass.layers_seen.max(index.saturating_add(1));
                index
            }
            None => index.unwrap_or(0),
        };
        let id = self.next_frame_id;
        self.next_frame_id += 1;
        let seq = self.next_seq();
        let start_ns = clock::now_ns();
        self.layers.push(LayerFrame {
            id,
            seq,
            index,
            record,
            tracepoint,
            start_ns,
            stages: Vec::new(),
        });
        let begin = LayerBegin {
            seq,
            pass: pass_id,
            layer: index,
            tracepoint: tracepoint.name,
            function: labels(Some(tracepoint)).1,
            start_ns,
        };
        self.for_each_sink(|sink| sink.layer_begin(&begin));
        (id, index)
    }

    /// Adds the layer's `input` or `output` to the frame `frame_id`.
    pub(crate) fn set_layer_tensor(&mut self, frame_id: u64, name: &'static str, read: StageRead) {
        let seq = self.next_seq();
        let Some(frame) = self.layers.iter_mut().rev().find(|f| f.id == frame_id) else {
            return;
        };
        let tensor = self.deferred.take(seq, read);
        frame.stages.push(StageEvent {
            seq,
            name: Cow::Borrowed(name),
            tensor,
        });
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
            let end_ns = clock::now_ns();
            let end = self.pass.as_ref().map(|pass| LayerEnd {
                seq: frame.seq,
                pass: pass.id,
                layer: frame.index,
                end_ns,
            });
            let has_stages = frame
                .stages
                .iter()
                .any(|s| s.name != "input" && s.name != "output");
            if !(frame.record || has_stages) {
                self.end_layer_span(end.as_ref());
                continue;
            }
            let Some(pass) = self.pass.as_ref().map(|pass| pass.id) else {
                continue;
            };
            let (tracepoint, function) = labels(Some(frame.tracepoint));
            let event = LayerEvent {
                seq: frame.seq,
                pass,
                layer: frame.index,
                tracepoint,
                function,
                start_ns: frame.start_ns,
                duration_ns: end_ns.saturating_sub(frame.start_ns),
                stages: frame.stages,
                residual_ratio: None,
            };
            // A layer with reads still on the device is judged when they are finished.
            if self.config.trace_activations && self.deferred.reads.is_empty() {
                self.recorder
                    .add_layer(LayerActivationTrace::from_event(&event));
            }
            self.emit(Event::Layer(event));
            self.end_layer_span(end.as_ref());
        }
    }

    /// Tells the sinks that a layer call ended (after its event, unless that is held).
    fn end_layer_span(&mut self, end: Option<&LayerEnd>) {
        if let Some(end) = end {
            self.for_each_sink(|sink| sink.layer_end(end));
        }
    }

    /// Adds a stage to the innermost open layer; `false` when there is none.
    pub(crate) fn record_stage(&mut self, stage: &'static str, read: StageRead) -> bool {
        let seq = self.next_seq();
        if self.layers.is_empty() {
            return false;
        }
        let tensor = self.deferred.take(seq, read);
        match self.layers.last_mut() {
            Some(frame) => {
                match frame.stages.iter_mut().find(|s| s.name == stage) {
                    // Recorded twice in one call: the last value, in its first place.
                    Some(existing) => {
                        existing.seq = seq;
                        existing.tensor = tensor;
                    }
                    None => frame.stages.push(StageEvent {
                        seq,
                        name: Cow::Borrowed(stage),
                        tensor,
                    }),
                }
                true
            }
            None => false,
        }
    }

    /// The innermost open layer's index.
    pub(crate) fn enclosing_layer(&self) -> Option<usize> {
        self.layers.last().map(|frame| frame.index)
    }

    /// The innermost open layer's index, if there is one and it records its statistics (the
    /// filter admits it): where a stage recorded for its layer's sake goes.
    pub(crate) fn enclosing_recorded_layer(&self) -> Option<usize> {
        self.layers
            .last()
            .filter(|frame| frame.record)
            .map(|frame| frame.index)
    }

    /// The layer of a value outside any layer: one past the last layer of this pass (0 with no
    /// pass open).
    pub(crate) fn final_layer(&self) -> usize {
        self.pass.as_ref().map_or(0, |pass| pass.layers_seen)
    }

    /// The enclosing layer, else the final one.
    pub(crate) fn layer_or_final(&self) -> usize {
        self.enclosing_layer().unwrap_or_else(|| self.final_layer())
    }

    // -----------------------------------------------------------------------------------------
    // Tensors and records
    // -----------------------------------------------------------------------------------------

    /// How to read a tensor of `tracepoint` recorded now in `layer`.
    pub(crate) fn plan(&self, tracepoint: &Tracepoint, layer: Option<usize>) -> TensorPlan {
        let capture = self
            .capture
            .as_ref()
            .is_some_and(|(filter, _)| filter.captures(tracepoint, self.pass_id(), layer));
        TensorPlan {
            digest: self.digest,
            capture,
            copy_below: self.config.device_copy_below,
        }
    }

    /// Saves `values` in full and points `summary` at them.
    pub(crate) fn attach_capture(
        &mut self,
        tracepoint: &'static Tracepoint,
        layer: Option<usize>,
        what: &str,
        summary: &mut TensorSummary,
        values: Vec<f32>,
    ) {
        let Some((_, writer)) = &mut self.capture else {
            return;
        };
        let pass = self
            .pass
            .as_ref()
            .map_or_else(|| "none".to_owned(), |p| p.id.to_string());
        let layer = layer.map_or_else(|| "none".to_owned(), |l| l.to_string());
        let name = format!("p{pass}.l{layer}.{what}.s{}", self.next_seq);
        match writer.add(name, summary.shape.clone(), values) {
            Ok(reference) => summary.capture = Some(reference),
            Err(error) => {
                let message = format!("could not save a tensor: {error}");
                self.note_error(Some(tracepoint), RecordErrorKind::Capture, message);
            }
        }
    }

    /// Emits a record event built with the next sequence number.
    pub(crate) fn emit_record(&mut self, build: impl FnOnce(u64, Option<usize>) -> Event) {
        let seq = self.next_seq();
        let event = build(seq, self.pass_id());
        self.emit(event);
    }

    /// Feeds the statistics of a logits tensor to the pass's anomaly rules.
    pub(crate) fn add_logits_stats(&mut self, layer: usize, stats: &TensorStats) {
        self.recorder.add_logits_stats(layer, stats);
    }

    /// Feeds a next-token row to the pass's logit tracking.
    pub(crate) fn add_logit_row(&mut self, layer: usize, batch: usize, row: &[f32]) {
        self.recorder.add_logit_row(&self.config, layer, batch, row);
    }

    /// Numbers a KV-cache step of the cache of `layer`.
    pub(crate) fn next_kv_step(&mut self, layer: Option<usize>) -> usize {
        match self.kv_steps.iter_mut().find(|(l, _)| *l == layer) {
            Some((_, steps)) => {
                let step = *steps;
                *steps += 1;
                step
            }
            None => {
                self.kv_steps.push((layer, 1));
                0
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Interventions
    // -----------------------------------------------------------------------------------------

    /// Whether the session has interventions at all: the one check a tracepoint makes when it
    /// has none.
    pub(crate) fn has_interventions(&self) -> bool {
        !self.interventions.is_empty()
    }

    /// Whether an intervention selects `stage` of `tracepoint` at `layer` in the open pass.
    pub(crate) fn intervenes(
        &self,
        tracepoint: &Tracepoint,
        layer: Option<usize>,
        stage: &str,
    ) -> bool {
        let pass = self.pass_id();
        self.interventions
            .iter()
            .any(|(i, _)| i.selector().selects(tracepoint, pass, layer, stage))
    }

    /// The interventions that select `stage` of `tracepoint` at `layer` in the open pass, with
    /// their index, and the pass's first token position.
    pub(crate) fn interventions_for(
        &self,
        tracepoint: &Tracepoint,
        layer: Option<usize>,
        stage: &str,
    ) -> (Vec<(usize, Intervention)>, usize) {
        let pass = self.pass_id();
        let selected = self
            .interventions
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| i.selector().selects(tracepoint, pass, layer, stage))
            .map(|(index, (i, _))| (index, i.clone()))
            .collect();
        (selected, self.pass.as_ref().map_or(0, |p| p.position))
    }

    /// Counts a tensor that intervention `index` changed (or failed to change, an error of its
    /// own).
    fn count_selection(&mut self, index: usize) {
        if let Some((_, selected)) = self.interventions.get_mut(index) {
            *selected += 1;
        }
    }

    /// Writes the event of a change by intervention `index`.
    fn record_intervention(
        &mut self,
        index: usize,
        tracepoint: &'static Tracepoint,
        layer: Option<usize>,
        stage: &str,
        applied: intervene::Applied,
    ) {
        let Some((intervention, _)) = self.interventions.get(index) else {
            return;
        };
        let text = intervention.to_string();
        let (tracepoint, function) = labels(Some(tracepoint));
        let stage = Cow::Owned(stage.to_owned());
        self.emit_record(|seq, pass| {
            Event::Intervention(InterventionEvent {
                seq,
                pass,
                layer,
                stage,
                tracepoint,
                function,
                intervention: text,
                source: applied.source,
                positions: applied.positions,
                before_l2: applied.before_l2,
                delta_l2: applied.delta_l2,
            })
        });
    }

    /// At the end: an intervention that changed nothing was most likely mistyped.
    fn warn_unused_interventions(&mut self) {
        let unused: Vec<String> = self
            .interventions
            .iter()
            .filter(|(_, selected)| *selected == 0)
            .map(|(intervention, _)| intervention.to_string())
            .collect();
        for text in unused {
            let message = format!(
                "intervention `{text}` changed nothing in the whole session: it selected no \
                 tensor, or no row of one (check its stage=, layer=, pass= and position=; \
                 model_trace::tracepoints() lists the tracepoints; a stage recorded with \
                 `trace_tensor!` is only borrowed and cannot be changed: record it with \
                 `trace_stage!`)"
            );
            self.note_error(None, RecordErrorKind::UnusedIntervention, message);
        }
    }

    // -----------------------------------------------------------------------------------------
    // The end
    // -----------------------------------------------------------------------------------------

    /// Closes what is still open, writes the session's end and flushes every sink. Runs once:
    /// from `finish`, from dropping the session (also while unwinding) or from the thread's end.
    pub(crate) fn end(&mut self) {
        if self.ended {
            return;
        }
        self.close_pass();
        self.warn_unused_interventions();
        if let Some((_, writer)) = &mut self.capture {
            if let Err(error) = writer.finish() {
                let message = format!("could not save captured tensors: {error}");
                self.note_error(None, RecordErrorKind::Capture, message);
            }
        }
        let errors = self
            .errors
            .all()
            .iter()
            .map(|e| {
                let (tracepoint, function) = labels(e.tracepoint);
                ErrorCount {
                    tracepoint,
                    function,
                    kind: e.kind,
                    message: e.message.clone(),
                    occurrences: e.occurrences,
                }
            })
            .collect();
        let event = Event::SessionEnd(SessionEnd {
            seq: self.next_seq(),
            end_ns: clock::now_ns(),
            passes: self.passes_begun,
            errors,
            errors_not_kept: self.errors.overflow,
        });
        self.emit(event);
        self.for_each_sink(|sink| sink.finish());
        self.ended = true;
    }

    /// Ends the session and hands back the in-memory tracer (empty when none was kept) and the
    /// errors (not the warnings, printed when they happened).
    pub(crate) fn into_results(mut self) -> (ModelTracer, Vec<RecordError>) {
        self.end();
        let tracer = std::mem::take(&mut self.memory);
        let mut errors = std::mem::take(&mut self.errors).into_vec();
        errors.retain(|error| !error.kind.is_warning());
        (tracer, errors)
    }
}

impl Drop for SessionState {
    fn drop(&mut self) {
        self.end();
    }
}
