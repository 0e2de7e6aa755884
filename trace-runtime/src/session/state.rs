//! The state machine of one session: the one owner of the pass and layer context, which turns
//! what hooks read into events and hands them to the session's sinks. Where the sessions of a
//! thread live is [`registry`](super::registry)'s; the interventions' part of the state is
//! [`interventions`](super::interventions)'.

use std::borrow::Cow;

use super::clock;
use super::errors::{ErrorBook, RecordError};
use super::interest::interest;
use crate::analysis::PassRecorder;
use crate::config::{DigestPolicy, ModelTracerConfig};
use crate::format::CaptureWriter;
use crate::id_hash::IdMap;
use crate::intervene::Intervention;
use crate::record::RecordErrorKind;
use crate::record::{
    labels, ErrorCount, ErrorEvent, Event, LayerActivationTrace, LayerEvent, PassBegin, PassEnd,
    SessionEnd, StageEvent, TraceHeader,
};
use crate::select::{CaptureFilter, TraceFilter};
use crate::sink::{LayerBegin, LayerEnd, ModelTracer, SinkError, TraceSink};
use crate::stats::TensorStats;
use crate::summary::TensorSummary;
use crate::tensor::{PendingSummary, TokensError};
use crate::tracepoint::callsite::{Callsite, Interest};
use crate::tracepoint::{Tracepoint, TracepointKind};

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
    /// [`ModelTracerConfig::row_summaries`], for a layer's tensor.
    pub(crate) rows: bool,
}

impl TensorPlan {
    /// The plan of a tensor that is not a layer's (attention probabilities, logits): no rows.
    pub(crate) fn without_rows(self) -> Self {
        Self {
            rows: false,
            ..self
        }
    }
}

/// A tensor of a layer as a hook read it: its summary, or a read that the end of the pass
/// finishes (a device's, see [`TraceTensor::start_summary`](crate::TraceTensor::start_summary)).
// The summary inline: boxing it would add an allocation to every host read, for a value that
// is moved a few times on its way to the layer's record.
#[allow(clippy::large_enum_variant)]
pub(crate) enum StageRead {
    Now(TensorSummary),
    /// The read that gives the summary at the end of the pass, and the tracepoint that asked.
    Later(PendingSummary, &'static Tracepoint),
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
    /// The summary to record for the stage `seq` now: the read's own, or an empty placeholder
    /// for a read kept for the end of the pass. The event that holds it is held back until
    /// then, and the read's summary replaces it whole (a read that fails takes its stage out),
    /// so nothing sees the placeholder: it costs no allocation.
    fn take(&mut self, seq: u64, read: StageRead) -> TensorSummary {
        match read {
            StageRead::Now(summary) => summary,
            StageRead::Later(read, tracepoint) => {
                self.reads.push((seq, read, tracepoint));
                TensorSummary::default()
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
    decisions: IdMap<usize, Interest>,
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
    /// Passes left out by the filter that are running now (see
    /// [`suspend`](super::registry::suspend)).
    pub(super) suspended: usize,
    /// Whether the implicit pass was warned about.
    implicit_pass_warned: bool,
    /// The interventions, each with the number of tensors it selected.
    pub(super) interventions: Vec<(Intervention, usize)>,
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
            decisions: IdMap::default(),
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

    /// What this session wants of `callsite`, decided the first time it asks.
    pub(super) fn interest_in(&mut self, callsite: &'static Callsite) -> Interest {
        let key = std::ptr::from_ref(callsite) as usize;
        let Self {
            decisions,
            config,
            filter,
            ..
        } = self;
        *decisions
            .entry(key)
            .or_insert_with(|| interest(config, filter, callsite.tracepoint()))
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
        // The buffers go back when this is done: every pass of a decode loop holds as many.
        let mut reads = std::mem::take(&mut self.deferred.reads);
        let mut held = std::mem::take(&mut self.deferred.held);
        let mut done: Vec<_> = reads
            .drain(..)
            .map(|(seq, read, tracepoint)| (seq, Some(read.finish()), tracepoint))
            .collect();
        let mut failures = Vec::new();
        for mut event in held.drain(..) {
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
        // Delivering starts no read, and nothing is held while no read is pending; were that
        // ever not so, what came in is kept and the emptied buffers go.
        if self.deferred.reads.is_empty() && self.deferred.held.is_empty() {
            self.deferred = Deferred { reads, held };
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

    /// The open pass's first token position; 0 with no pass open.
    pub(super) fn pass_position(&self) -> usize {
        self.pass.as_ref().map_or(0, |pass| pass.position)
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
            rows: self.config.row_summaries && layer.is_some(),
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
