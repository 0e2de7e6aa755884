//! Reading the traces of a comparison as streams: each trace on a thread of its own (the ranks
//! of a run merged pass by pass), each pass's tensors handed on when the pass is complete, and
//! the passes of the traces aligned by pass number for the comparison.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use trace_runtime::compare::TraceTensors;
use trace_runtime::{Event, QuantizationErrorTrace, RouterEvent};

use super::tokens::{LogitsRecord, PassLogits};
use crate::input::{self, InputError, TraceRun};
use crate::stage_check::{CheckVerdict, StageChecker};

/// Passes read ahead of the comparison, per trace.
const PASSES_AHEAD: usize = 4;

/// One pass's tensors of one trace (every rank's); `pass` is `None` for the attention records
/// made outside any pass, handed on at the end.
pub(super) struct PassTensors {
    pub(super) pass: Option<usize>,
    /// The token ids the pass consumed, as its `pass_begin` (the first rank's) says; `None`
    /// where it does not say.
    pub(super) tokens: Option<Vec<u32>>,
    /// Its logits records' best tokens.
    pub(super) logits: PassLogits,
    /// Its quantization records (`quant` events): each quantized computation's error against
    /// its full-precision reference.
    pub(super) quant: Vec<QuantizationErrorTrace>,
    /// Its router calls (`router` events), every rank's, in recording order.
    pub(super) routers: Vec<RouterEvent>,
    /// The position of the pass's first token, as its `pass_begin` says.
    pub(super) position: Option<usize>,
    pub(super) tensors: TraceTensors,
}

impl PassTensors {
    /// Passes in order, then the tensors outside any pass.
    fn order(&self) -> (bool, usize) {
        (self.pass.is_none(), self.pass.unwrap_or(0))
    }
}

/// What reading one trace for a comparison gave besides its passes.
pub(super) struct ReaderTally {
    pub(super) notes: input::ReadNotes,
    /// Tensors read.
    pub(super) tensors: usize,
    /// Tensors that came after their pass had been handed on (a file not in pass order).
    pub(super) late: usize,
    /// The trace's stage check.
    pub(super) stage_check: CheckVerdict,
}

/// Reads `runs`, one thread each, and hands `compare` their passes, aligned (see [`aligned`]);
/// then each run's tally, in the order of `runs`, or the first error of a reader.
pub(super) fn read_aligned(
    runs: &[&TraceRun],
    compare: impl FnOnce(&mut dyn Iterator<Item = Vec<Option<PassTensors>>>),
) -> Result<Vec<ReaderTally>, InputError> {
    let tallies: Vec<Result<ReaderTally, InputError>> = std::thread::scope(|scope| {
        let mut receivers = Vec::with_capacity(runs.len());
        let mut readers = Vec::with_capacity(runs.len());
        for &run in runs {
            // Each reader owns its sender: when it ends, the comparison sees the end.
            let (send, receive) = sync_channel(PASSES_AHEAD);
            readers.push(scope.spawn(move || read_passes(run, &send)));
            receivers.push(receive);
        }
        compare(&mut aligned(&receivers));
        // A reader stopped by an error has dropped its sender; the others may still be
        // sending: stop listening so that they end.
        drop(receivers);
        readers
            .into_iter()
            .map(|read| {
                read.join()
                    .unwrap_or_else(|_| Err("reading a trace failed".to_owned()))
            })
            .collect()
    });
    tallies.into_iter().collect()
}

/// The passes `readers` send, aligned: each item holds, reader by reader, its pass of the lowest
/// order any of them has next (`None` for a reader whose next pass is a later one).
fn aligned(
    readers: &[Receiver<PassTensors>],
) -> impl Iterator<Item = Vec<Option<PassTensors>>> + '_ {
    let mut heads: Vec<Option<PassTensors>> = readers.iter().map(|r| r.recv().ok()).collect();
    std::iter::from_fn(move || {
        let order = heads.iter().flatten().map(PassTensors::order).min()?;
        let passes = heads.iter_mut().zip(readers).map(|(head, reader)| {
            if head.as_ref().is_some_and(|p| p.order() == order) {
                std::mem::replace(head, reader.recv().ok())
            } else {
                None
            }
        });
        Some(passes.collect())
    })
}

/// Reads `run` and sends its tensors pass by pass, checking its stages as it goes.
fn read_passes(run: &TraceRun, send: &SyncSender<PassTensors>) -> Result<ReaderTally, InputError> {
    // Captures it cannot read are the comparison's warnings too: its own are not repeated.
    let mut checker = StageChecker::new(run);
    let mut passes = PassSender::new(run, send);
    let notes = input::read(run, |file, event| {
        if let Ok(checker) = checker.as_mut() {
            checker.event(run, file, &event);
        }
        passes.event(run.index_of(file), event);
    })?;
    let (tensors, late) = passes.finish();
    Ok(ReaderTally {
        notes,
        tensors,
        late,
        stage_check: match checker {
            Ok(checker) => checker.verdict(),
            Err(why) => CheckVerdict::not_run(why),
        },
    })
}

/// One trace's events gathered into passes, each pass sent on once a later one begins.
struct PassSender<'a> {
    send: &'a SyncSender<PassTensors>,
    /// Whether the comparison still listens (it stops at an error of another reader).
    listening: bool,
    /// Per rank file, its tensors of the pass `current`.
    pending: Vec<TraceTensors>,
    /// Per rank file, its tensors outside any pass.
    outside: Vec<TraceTensors>,
    /// The pass being read.
    current: Option<usize>,
    /// The token ids of the pass `current`.
    tokens: Option<Vec<u32>>,
    /// The logits records of the pass `current`.
    logits: PassLogits,
    /// The quantization records of the pass `current`.
    quant: Vec<QuantizationErrorTrace>,
    /// The router calls of the pass `current`.
    routers: Vec<RouterEvent>,
    /// The router calls outside any pass.
    outside_routers: Vec<RouterEvent>,
    /// The position of the pass `current`.
    position: Option<usize>,
    /// Tensors read.
    tensors: usize,
    /// Tensors that came after their pass had been sent.
    late: usize,
}

impl<'a> PassSender<'a> {
    fn new(run: &TraceRun, send: &'a SyncSender<PassTensors>) -> Self {
        let mut pending: Vec<TraceTensors> = run
            .files
            .iter()
            .map(|f| TraceTensors::new(&f.header, Some(&f.path)))
            .collect();
        let outside = pending.iter_mut().map(TraceTensors::take).collect();
        Self {
            send,
            listening: true,
            pending,
            outside,
            current: None,
            tokens: None,
            logits: PassLogits::default(),
            quant: Vec::new(),
            routers: Vec::new(),
            outside_routers: Vec::new(),
            position: None,
            tensors: 0,
            late: 0,
        }
    }

    /// Takes one event of the rank file `at`.
    fn event(&mut self, at: usize, event: Event) {
        match (event.pass(), self.current) {
            (None, _) => match event {
                Event::Router(router) => self.outside_routers.push(router),
                event => self.outside[at].push(event),
            },
            (Some(pass), Some(current)) if pass < current => {
                let mut counted = TraceTensors::default();
                counted.push(event);
                self.late += counted.tensors.len();
            }
            (Some(pass), _) => self.event_in_pass(pass, at, event),
        }
    }

    /// Takes an event of `pass`, the pass being read or a later one (which sends the one
    /// being read on).
    fn event_in_pass(&mut self, pass: usize, at: usize, event: Event) {
        if self.current.is_some_and(|current| current < pass) {
            self.send_current();
        }
        self.current = Some(pass);
        // The reader hands on one begin of a pass: the first rank's.
        if let Event::PassBegin(begin) = event {
            self.tokens = begin.tokens;
            self.position.get_or_insert(begin.position);
            return;
        }
        if let Event::Router(router) = event {
            self.routers.push(router);
            return;
        }
        match &event {
            Event::Logits(record) => self.logits.records.extend(LogitsRecord::of(record)),
            Event::Quant(record) => self.quant.push(record.error.clone()),
            _ => {}
        }
        let pending = &mut self.pending[at];
        let before = pending.tensors.len();
        pending.push(event);
        self.tensors += pending.tensors.len() - before;
    }

    /// Sends the pass being read, its ranks merged.
    fn send_current(&mut self) {
        let pass = PassTensors {
            pass: self.current,
            tokens: self.tokens.take(),
            logits: std::mem::take(&mut self.logits),
            quant: std::mem::take(&mut self.quant),
            routers: std::mem::take(&mut self.routers),
            position: self.position.take(),
            tensors: merged(&mut self.pending),
        };
        self.send(pass);
    }

    /// Sends `pass` while the comparison listens, unless it holds no tensors and no router
    /// calls.
    fn send(&mut self, pass: PassTensors) {
        let empty = pass.tensors.tensors.is_empty() && pass.routers.is_empty();
        if self.listening && !empty {
            self.listening = self.send.send(pass).is_ok();
        }
    }

    /// Sends the last pass, then the tensors outside any pass; the tensors read, and how
    /// many came late.
    fn finish(mut self) -> (usize, usize) {
        self.send_current();
        self.tensors += self.outside.iter().map(|t| t.tensors.len()).sum::<usize>();
        let outside = PassTensors {
            pass: None,
            tokens: None,
            logits: PassLogits::default(),
            quant: Vec::new(),
            routers: std::mem::take(&mut self.outside_routers),
            position: None,
            tensors: merged(&mut self.outside),
        };
        self.send(outside);
        (self.tensors, self.late)
    }
}

/// The tensors of `ranks`, taken and merged into one rank's.
fn merged(ranks: &mut [TraceTensors]) -> TraceTensors {
    TraceTensors::merge_ranks(ranks.iter_mut().map(TraceTensors::take))
}
