//! Two traces read and compared, and what that comparison reports (as text or JSON): what
//! `diff` prints, and what `report --against` puts on its page.
//!
//! The comparison streams: each trace is read on a thread of its own (the ranks of a run
//! merged pass by pass), each pass's tensors are handed on when the pass is complete, and the
//! passes are compared as they come, keeping only what the report needs: the counts, the first
//! divergence, one row per pass, the tensors of the pass the per-layer table is about, and the
//! first [`LISTED`] unmatched tensors and warnings of each kind. Memory does not grow with the
//! tensors of a pass times the passes.

pub(crate) mod tokens;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use serde::Serialize;
use trace_runtime::compare::{
    compare, compare_with_least_rtol, full_name, CompareOptions, TensorComparison, TensorKey,
    Tolerances, TraceTensors, TracedTensor, Unmatched, UnusedOverride, Verdict,
};
use trace_runtime::{CaptureError, CaptureFiles, Event};

use crate::comparison::tokens::{
    Choices, FirstTokenDivergence, LogitsRecord, PassLogits, TokenVerdict,
};
use crate::input::{self, InputError, TraceFile, TraceRun};
use crate::stage_check::{CheckVerdict, StageChecker};
use crate::style::Colors;

/// Unmatched tensors listed in the text output before "... and N more".
const SHOWN_UNMATCHED: usize = 8;

/// Unmatched tensors (of each trace) and warnings kept for the JSON output; the others are
/// counted.
pub(crate) const LISTED: usize = 1000;

/// Passes read ahead of the comparison, per trace.
const PASSES_AHEAD: usize = 4;

/// Passes of a trace whose token ids differ from the reference's, each a warning of its own;
/// the others are counted in one.
const TOKEN_WARNINGS: usize = 3;

/// Token ids shown of a pass's, in a warning.
const SHOWN_TOKENS: usize = 8;

/// Two traces read and compared, with a floor's trace where one sets the tolerances.
pub(crate) struct Diffed {
    files: [FileInfo; 2],
    floor: Option<FileInfo>,
    options: CompareOptions,
    found: Found,
}

/// A second implementation's trace that sets the tolerance tensor by tensor (`--floor`): a
/// tensor's rtol is the larger of the given one and `factor` times the floor's error, the
/// smallest rtol at which the floor is close to the reference.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floor<'a> {
    pub(crate) path: &'a Path,
    /// How many times the floor's error the other trace may have.
    pub(crate) factor: f64,
}

impl Diffed {
    /// Reads the traces (one thread each) and compares them pass by pass, reading captured
    /// tensors where `options` says to; with a `floor`, compares it with the reference first,
    /// pass by pass, and judges `other` by the tolerances it sets. The per-layer table will be
    /// about `pass` (default: the first divergence's, else the one with the largest error).
    pub(crate) fn read(
        reference: &Path,
        other: &Path,
        floor: Option<Floor<'_>>,
        options: CompareOptions,
        pass: Option<usize>,
    ) -> Result<Self, InputError> {
        let ref_run = TraceRun::open(&[reference.to_path_buf()])?;
        let other_run = TraceRun::open(&[other.to_path_buf()])?;
        let floor_run = floor
            .map(|f| TraceRun::open(&[f.path.to_path_buf()]))
            .transpose()?;
        let runs: Vec<&TraceRun> = [Some(&ref_run), Some(&other_run), floor_run.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        for run in &runs {
            run.warn_missing_ranks();
        }
        let mut found = Found::new(pass, &options, floor.map(|f| f.factor));
        // An isolated run was fed the reference's layer inputs: they match by construction
        // (up to the run's own dtype), so its first divergence is sought among what the layers
        // computed.
        found.inputs_fed = other_run.header().isolate.is_some();
        let reads: Vec<Result<ReadPasses, InputError>> = std::thread::scope(|scope| {
            let mut receivers = Vec::with_capacity(runs.len());
            let mut readers = Vec::with_capacity(runs.len());
            for &run in &runs {
                // Each reader owns its sender: when it ends, the comparison sees the end.
                let (send, receive) = sync_channel(PASSES_AHEAD);
                readers.push(scope.spawn(move || read_passes(run, &send)));
                receivers.push(receive);
            }
            let labels: Vec<&str> = runs.iter().map(|run| run.label.as_str()).collect();
            found.compare_passes(&receivers, &options, &labels);
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
        let reads = reads.into_iter().collect::<Result<Vec<_>, _>>()?;
        if reads[0].tensors == 0 {
            return Err(format!(
                "{}: no tensors to compare (no layer, attention or logits events)",
                ref_run.label
            ));
        }
        if found.counts.matched == 0 {
            return Err(no_match(&other_run, &ref_run));
        }
        if let Some(floor_run) = &floor_run {
            if found.floor_matched == 0 {
                return Err(no_match(floor_run, &ref_run));
            }
        }
        found.finish(&options, &reads, &runs);
        let info = |run: &TraceRun, read: &ReadPasses| FileInfo {
            path: run.label.clone(),
            writer: run.header().writer.clone(),
            ranks: run.is_ranked().then_some(run.files.len()),
            tensors: read.tensors,
            cut_short: read.notes.truncation(),
            interventions: run.header().interventions.clone(),
            isolate: run.header().isolate.clone(),
            stage_check: read.stage_check.clone(),
        };
        Ok(Self {
            files: [info(&ref_run, &reads[0]), info(&other_run, &reads[1])],
            floor: floor_run.as_ref().map(|run| info(run, &reads[2])),
            options,
            found,
        })
    }

    /// What to report.
    pub(crate) fn report(&self) -> Report<'_> {
        Report::new(&self.files, self.floor.as_ref(), &self.found, &self.options)
    }

    /// Whether a tensor diverged.
    pub(crate) fn diverged(&self) -> bool {
        self.found.first.is_some()
    }

    /// The compared tensors of the pass the per-layer table is about.
    pub(crate) fn table_pairs(&self) -> &[Judged] {
        &self.found.table.pairs
    }

    /// The pass the per-layer table is about.
    pub(crate) fn table_pass(&self) -> usize {
        self.found.table.pass.unwrap_or(0)
    }

    /// The first divergence (for an isolated run, the first among what the layers computed).
    pub(crate) fn first(&self) -> Option<&TensorComparison> {
        self.found.first.as_ref().map(|first| &first.pair)
    }

    /// The floor's trace, and how many times its error the other may have.
    pub(crate) fn floor(&self) -> Option<(&str, f64)> {
        let file = self.floor.as_ref()?;
        Some((&file.path, self.found.floor_factor?))
    }

    /// Per layer of the table's pass, its worst tensor and that tensor's ratio; an isolated
    /// run's layer inputs, fed from the reference, left out.
    pub(crate) fn worst_by_layer(&self) -> BTreeMap<usize, (&TensorComparison, f64)> {
        let fed = |judged: &&Judged| self.found.inputs_fed && judged.pair.name == "input";
        let computed = self.found.table.pairs.iter().filter(|judged| !fed(judged));
        (worst_per_layer(computed).into_iter())
            .map(|(layer, (judged, ratio))| (layer, (&judged.pair, ratio)))
            .collect()
    }

    /// The reference file that an isolated other trace was fed, if it is one.
    pub(crate) fn other_isolated_from(&self) -> Option<&str> {
        self.files[1].isolate.as_deref()
    }

    /// A warning per trace (the reference, the other, the floor) that fails the stage check:
    /// a wrong stage map must not pass for a numeric divergence.
    pub(crate) fn stage_check_warnings(&self) -> Vec<String> {
        let sides = [
            ("the reference", Some(&self.files[0])),
            ("the other trace", Some(&self.files[1])),
            ("the floor", self.floor.as_ref()),
        ];
        (sides.into_iter())
            .filter_map(|(label, info)| {
                let info = info?;
                info.stage_check.warning(label, &info.path)
            })
            .collect()
    }

    /// The warning about the other trace alone, named `label` (an isolated run, whose
    /// reference the plain comparison has already judged).
    pub(crate) fn other_stage_check_warning(&self, label: &str) -> Option<String> {
        let info = &self.files[1];
        info.stage_check.warning(label, &info.path)
    }

    /// Says on stderr which traces fail the stage check.
    pub(crate) fn warn_stage_check(&self) {
        for warning in self.stage_check_warnings() {
            eprintln!("model-trace: warning: {warning}");
        }
    }

    /// Says on stderr which per-name overrides matched no tensor (the JSON output has them
    /// among its `warnings`).
    pub(crate) fn warn_unused_overrides(&self) {
        for unused in &self.found.unused_overrides {
            eprintln!("model-trace: warning: {unused}");
        }
    }
}

/// Per layer, the tensor of `pairs` with the largest ratio (the first of equals), and that ratio.
fn worst_per_layer<'a>(
    pairs: impl IntoIterator<Item = &'a Judged>,
) -> BTreeMap<usize, (&'a Judged, f64)> {
    let mut layers: BTreeMap<usize, (&Judged, f64)> = BTreeMap::new();
    for judged in pairs {
        let r = judged.pair.ratio();
        let row = layers.entry(judged.pair.layer).or_insert((judged, r));
        if r > row.1 {
            *row = (judged, r);
        }
    }
    layers
}

/// Why nothing was compared: no tensor of `run` matches one of `reference`.
fn no_match(run: &TraceRun, reference: &TraceRun) -> InputError {
    format!(
        "no tensor of {} matches one of {} by (pass, layer, name); the names differ? \
         (--map llama|bert|FILE renames them)",
        run.label, reference.label
    )
}

/// One pass's tensors of one trace (every rank's); `pass` is `None` for the attention records
/// made outside any pass, handed on at the end.
struct PassTensors {
    pass: Option<usize>,
    /// The token ids the pass consumed, as its `pass_begin` (the first rank's) says; `None`
    /// where it does not say.
    tokens: Option<Vec<u32>>,
    /// Its logits records' best tokens.
    logits: PassLogits,
    tensors: TraceTensors,
}

impl PassTensors {
    /// Passes in order, then the tensors outside any pass.
    fn order(&self) -> (bool, usize) {
        (self.pass.is_none(), self.pass.unwrap_or(0))
    }
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

/// What reading one trace for a comparison gave.
struct ReadPasses {
    notes: input::ReadNotes,
    /// Tensors read.
    tensors: usize,
    /// Tensors that came after their pass had been handed on (a file not in pass order).
    late: usize,
    /// The trace's stage check.
    stage_check: CheckVerdict,
}

/// Reads `run` and sends its tensors pass by pass.
fn read_passes(run: &TraceRun, send: &SyncSender<PassTensors>) -> Result<ReadPasses, InputError> {
    let mut pending: Vec<TraceTensors> = run
        .files
        .iter()
        .map(|f| TraceTensors::new(&f.header, Some(&f.path)))
        .collect();
    let mut outside: Vec<TraceTensors> = pending.iter_mut().map(TraceTensors::take).collect();
    let (mut current, mut tensors, mut late) = (None::<usize>, 0, 0);
    // The token ids of the pass `current`.
    let mut tokens = None::<Vec<u32>>;
    // The logits records of the pass `current`.
    let mut logits = PassLogits::default();
    // Captures it cannot read are the comparison's warnings too: its own are not repeated.
    let mut checker = StageChecker::new(run);
    let mut listening = true;
    let mut hand_on = |pass: Option<usize>,
                       tokens: Option<Vec<u32>>,
                       logits: PassLogits,
                       parts: &mut [TraceTensors]| {
        let tensors = TraceTensors::merge_ranks(parts.iter_mut().map(TraceTensors::take));
        if listening && !tensors.tensors.is_empty() {
            let pass = PassTensors {
                pass,
                tokens,
                logits,
                tensors,
            };
            listening = send.send(pass).is_ok();
        }
    };
    let notes = input::read(run, |file, event| {
        if let Ok(checker) = checker.as_mut() {
            checker.event(run, file, &event);
        }
        let at = rank_index(run, file);
        let pass = event.pass();
        match (pass, current) {
            (None, _) => outside[at].push(event),
            (Some(p), Some(c)) if p < c => {
                let mut counted = TraceTensors::default();
                counted.push(event);
                late += counted.tensors.len();
            }
            (Some(p), c) => {
                if c.is_some_and(|c| c < p) {
                    hand_on(c, tokens.take(), std::mem::take(&mut logits), &mut pending);
                }
                current = Some(p);
                // The reader hands on one begin of a pass: the first rank's.
                if let Event::PassBegin(begin) = event {
                    tokens = begin.tokens;
                    return;
                }
                if let Event::Logits(record) = &event {
                    let rows = &record.batch_rows;
                    if let Some(row) = rows.iter().find(|r| r.batch == 0).or(rows.first()) {
                        logits.records.push(LogitsRecord {
                            layer: record.layer,
                            row: row
                                .top_tokens
                                .iter()
                                .copied()
                                .zip(row.top_logits.iter().copied())
                                .collect(),
                            l2_norm: record.logits.stats.l2_norm,
                            count: record.logits.stats.count,
                        });
                    }
                }
                let before = pending[at].tensors.len();
                pending[at].push(event);
                tensors += pending[at].tensors.len() - before;
            }
        }
    })?;
    hand_on(current, tokens, logits, &mut pending);
    tensors += outside.iter().map(|t| t.tensors.len()).sum::<usize>();
    hand_on(None, None, PassLogits::default(), &mut outside);
    Ok(ReadPasses {
        notes,
        tensors,
        late,
        stage_check: match checker {
            Ok(checker) => checker.verdict(),
            Err(why) => CheckVerdict::not_run(why),
        },
    })
}

/// The index of `file` among `run`'s files.
fn rank_index(run: &TraceRun, file: &TraceFile) -> usize {
    run.files
        .iter()
        .position(|f| std::ptr::eq(f, file))
        .unwrap_or(0)
}

/// The values of a captured tensor, read from beside the trace file it came from.
fn captured(
    files: &mut CaptureFiles,
    tensor: &TracedTensor,
) -> Option<Result<Vec<f32>, CaptureError>> {
    let capture = tensor.tensor.capture.as_ref()?;
    let file = tensor.file.as_ref()?;
    Some(files.read_capture(file, capture).map(|(_, values)| values))
}

/// A compared tensor, with the tolerance a floor set it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Judged {
    #[serde(flatten)]
    pub(crate) pair: TensorComparison,
    /// The floor's error: the smallest rtol at which the floor is close to the reference for
    /// this tensor; `null` without `--floor`, or where the floor sets no tolerance.
    pub(crate) floor_rtol: Option<f64>,
    /// Whether `floor_rtol` is exact (both captured) rather than bounded by summaries; `null`
    /// where `floor_rtol` is.
    floor_exact: Option<bool>,
    /// Why the floor sets no tolerance for this tensor (`missing`, `shape_mismatch`,
    /// `not_close`); `null` where it sets one, or without `--floor`.
    no_floor: Option<NoFloor>,
    /// The rtol the tensor was judged with: the larger of the given one and the floor factor
    /// times `floor_rtol`; `null` without `--floor`.
    pub(crate) allowed_rtol: Option<f64>,
}

impl Judged {
    /// `pair`, judged with the tolerance `floor` set (`None`: no floor given).
    fn new(pair: TensorComparison, floor: Option<FloorOf>) -> Self {
        let (floor_rtol, floor_exact, no_floor) = match floor {
            None => (None, None, None),
            Some(FloorOf::Error { rtol, exact }) => (Some(rtol), Some(exact), None),
            Some(FloorOf::Without(why)) => (None, None, Some(why)),
        };
        Self {
            allowed_rtol: floor.map(|_| pair.tolerance.rtol),
            pair,
            floor_rtol,
            floor_exact,
            no_floor,
        }
    }

    /// The other's error over the floor's: its least rtol over the floor's (0 where the other
    /// needs none, infinite where no rtol is enough or the floor needs none); `None` without a
    /// floor's error for this tensor.
    pub(crate) fn floor_ratio(&self) -> Option<f64> {
        let floor = self.floor_rtol?;
        Some(match self.pair.least_rtol {
            Some(0.0) => 0.0,
            Some(other) if floor > 0.0 => other / floor,
            _ => f64::INFINITY,
        })
    }
}

/// What a floor says of one tensor.
#[derive(Debug, Clone, Copy)]
enum FloorOf {
    /// Its error: the smallest rtol at which it is close to the reference, and whether that
    /// is exact (both captured).
    Error { rtol: f64, exact: bool },
    /// It sets no tolerance.
    Without(NoFloor),
}

/// Why a floor sets no tolerance for a tensor (the given rtol then applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NoFloor {
    /// The floor has no such tensor.
    Missing,
    /// The floor's tensor has another shape than the reference's.
    ShapeMismatch,
    /// No rtol makes the floor's tensor close to the reference's (NaN or infinity counts that
    /// differ, a value off where the reference is 0 under `elementwise`).
    NotClose,
}

impl NoFloor {
    fn describe(self) -> &'static str {
        match self {
            Self::Missing => "not in the floor",
            Self::ShapeMismatch => "another shape in the floor",
            Self::NotClose => "the floor close at no rtol",
        }
    }
}

/// A compared tensor the floor set no tolerance for.
#[derive(Debug, Serialize)]
struct NoFloorFor {
    #[serde(flatten)]
    tensor: TensorKey,
    why: NoFloor,
}

/// `[7042, 30]`: the first [`SHOWN_TOKENS`] ids, then `…` and how many there are.
fn ids_text(ids: &[u32]) -> String {
    let shown: Vec<String> = ids.iter().take(SHOWN_TOKENS).map(u32::to_string).collect();
    if ids.len() > SHOWN_TOKENS {
        format!("[{}, …] ({} ids)", shown.join(", "), ids.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// What a compared tensor is matched by.
fn key_of(pair: &TensorComparison) -> TensorKey {
    TensorKey {
        pass: pair.pass,
        layer: pair.layer,
        name: pair.name.clone(),
        shard: pair.shard,
    }
}

/// What the comparison found so far, folded pass by pass.
#[derive(Debug, Default)]
struct Found {
    counts: Counts,
    first: Option<Judged>,
    passes: Vec<PassRow>,
    table: Table,
    missing: Listed<Unmatched>,
    extra: Listed<Unmatched>,
    /// Captures that could not be read, tensors read out of pass order, passes that consumed
    /// other tokens than the reference's.
    warnings: Listed<String>,
    /// Full names (after renaming) of every tensor of either trace: which overrides matched
    /// (kept only when there are overrides).
    names: HashSet<String>,
    track_names: bool,
    unused_overrides: Vec<UnusedOverride>,
    /// The other trace is an isolated run: layer inputs are not candidates for the first
    /// divergence.
    inputs_fed: bool,
    /// With a floor: how many times its error the other may have.
    floor_factor: Option<f64>,
    /// Tensors of the reference the floor matched.
    floor_matched: usize,
    /// Compared tensors the floor set no tolerance for.
    no_floor: Listed<NoFloorFor>,
    /// Compared tensors whose error and the floor's were measured unlike: one by captures, the
    /// other bounded by summaries.
    unlike_floor: Listed<TensorKey>,
    /// Passes that consumed other token ids than the reference's: the other's, the floor's.
    other_tokens: [OtherTokens; 2],
    /// The capture files read so far, each one's header parsed once.
    captures: CaptureFiles,
    /// The tokens each run chose, pass by pass, until they part.
    choices: Choices,
}

/// The passes of a trace that consumed other token ids than the same passes of the reference:
/// the first [`TOKEN_WARNINGS`] are each a warning, the others counted.
#[derive(Debug, Default)]
struct OtherTokens {
    passes: usize,
    /// The first pass counted, not warned of.
    first_counted: Option<usize>,
}

/// The pass of the per-layer table and its compared tensors.
#[derive(Debug, Default)]
struct Table {
    /// The pass asked for.
    requested: Option<usize>,
    pass: Option<usize>,
    pairs: Vec<Judged>,
    /// Its worst ratio, while it is the pass with the largest error.
    worst_ratio: f64,
}

/// The first [`LISTED`] items, and how many there were.
#[derive(Debug)]
struct Listed<T> {
    items: Vec<T>,
    count: usize,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            count: 0,
        }
    }
}

impl<T> Listed<T> {
    fn push(&mut self, item: T) {
        self.count += 1;
        if self.items.len() < LISTED {
            self.items.push(item);
        }
    }
}

impl Found {
    fn new(pass: Option<usize>, options: &CompareOptions, floor_factor: Option<f64>) -> Self {
        let t = &options.tolerances;
        Self {
            floor_factor,
            table: Table {
                requested: pass,
                ..Table::default()
            },
            track_names: !(t.atol_overrides.is_empty()
                && t.rtol_overrides.is_empty()
                && t.error_stat_overrides.is_empty()),
            ..Self::default()
        }
    }

    /// Notes a tensor's full name, for the overrides that matched none.
    fn saw(&mut self, layer: usize, name: &str) {
        if self.track_names {
            let full = full_name(layer, name);
            if !self.names.contains(&full) {
                self.names.insert(full);
            }
        }
    }

    /// Compares the passes the readers send (the reference's, the other's, and the floor's
    /// if there is one, `labels` naming them), matching them by pass number; with a floor,
    /// compares it with the reference first, pass by pass, for the tolerances it sets. A pass
    /// that consumed other token ids than the reference's is a warning.
    fn compare_passes(
        &mut self,
        readers: &[Receiver<PassTensors>],
        options: &CompareOptions,
        labels: &[&str],
    ) {
        let empty = TraceTensors::default();
        for mut passes in aligned(readers) {
            let logits = [0, 1].map(|at| {
                (passes[at].as_mut())
                    .map_or_else(PassLogits::default, |p| std::mem::take(&mut p.logits))
            });
            let tensors = |at: usize| passes.get(at).and_then(Option::as_ref).map(|p| &p.tensors);
            let pass = passes[..2].iter().flatten().next().and_then(|p| p.pass);
            self.compare_tokens(&passes, labels);
            let floors = match (self.floor_factor, tensors(0)) {
                (Some(_), Some(reference)) => {
                    Some(self.floor_errors(reference, tensors(2).unwrap_or(&empty), options))
                }
                _ => None,
            };
            let factor = self.floor_factor.unwrap_or(1.0);
            let compared = compare_with_least_rtol(
                tensors(0).unwrap_or(&empty),
                tensors(1).unwrap_or(&empty),
                options,
                |_, tensor| captured(&mut self.captures, tensor),
                |key| match floors.as_ref()?.get(key)? {
                    FloorOf::Error { rtol, .. } => Some(rtol * factor),
                    FloorOf::Without(_) => None,
                },
            );
            if let Some(pass) = pass {
                let final_logits = (compared.pairs.iter())
                    .filter(|pair| pair.name == "logits")
                    .max_by_key(|pair| pair.layer)
                    .cloned();
                let consumed =
                    [0, 1].map(|at| passes[at].as_ref().and_then(|p| p.tokens.as_deref()));
                self.choices.pass(pass, logits, consumed, final_logits);
            }
            self.fold(pass, floors.as_ref(), compared);
        }
        self.choices.finish();
    }

    /// Warns of each of `passes` (one pass of each trace, `labels` naming the traces) that
    /// consumed other token ids than the reference's; says nothing where either does not say
    /// which ids it consumed.
    fn compare_tokens(&mut self, passes: &[Option<PassTensors>], labels: &[&str]) {
        let Some(reference) = &passes[0] else {
            return;
        };
        let (Some(pass), Some(ours)) = (reference.pass, reference.tokens.as_deref()) else {
            return;
        };
        for (at, theirs) in passes.iter().enumerate().skip(1) {
            if let Some(theirs) = theirs.as_ref().and_then(|p| p.tokens.as_deref()) {
                if ours != theirs {
                    self.other_tokens_in(at - 1, pass, [labels[0], labels[at]], [ours, theirs]);
                }
            }
        }
    }

    /// Warns that `pass` consumed other token ids in the reference than in the other or the
    /// floor (`at`: 0, 1), `labels` and `ids` the reference's then theirs; past
    /// [`TOKEN_WARNINGS`] such passes of that trace, counts it instead.
    fn other_tokens_in(&mut self, at: usize, pass: usize, labels: [&str; 2], ids: [&[u32]; 2]) {
        let seen = &mut self.other_tokens[at];
        seen.passes += 1;
        if seen.passes > TOKEN_WARNINGS {
            seen.first_counted.get_or_insert(pass);
            return;
        }
        let first = ids[0]
            .iter()
            .zip(ids[1])
            .take_while(|(a, b)| a == b)
            .count();
        let hidden = if first >= SHOWN_TOKENS {
            format!(", differing first at index {first}")
        } else {
            String::new()
        };
        self.warnings.push(format!(
            "pass {pass} consumed other tokens in {} ({}) than in {} ({}){hidden}",
            labels[0],
            ids_text(ids[0]),
            labels[1],
            ids_text(ids[1])
        ));
    }

    /// What the floor says of each tensor of one pass of the reference it matched: its error
    /// (the smallest rtol at which it is close), or why there is none.
    fn floor_errors(
        &mut self,
        reference: &TraceTensors,
        floor: &TraceTensors,
        options: &CompareOptions,
    ) -> HashMap<TensorKey, FloorOf> {
        let compared = compare(reference, floor, options, |_, tensor| {
            captured(&mut self.captures, tensor)
        });
        for warning in compared.warnings {
            self.warnings.push(format!("the floor: {warning}"));
        }
        self.floor_matched += compared.pairs.len();
        compared
            .pairs
            .into_iter()
            .map(|pair| {
                let of = match (pair.verdict, pair.least_rtol) {
                    (Verdict::ShapeMismatch, _) => FloorOf::Without(NoFloor::ShapeMismatch),
                    (_, None) => FloorOf::Without(NoFloor::NotClose),
                    (_, Some(rtol)) => FloorOf::Error {
                        rtol,
                        exact: pair.error.exact,
                    },
                };
                (key_of(&pair), of)
            })
            .collect()
    }

    /// Folds one pass's comparison in, with what the floor says of its tensors.
    fn fold(
        &mut self,
        pass: Option<usize>,
        floors: Option<&HashMap<TensorKey, FloorOf>>,
        compared: trace_runtime::compare::Comparison,
    ) {
        for unmatched in compared.missing {
            self.saw(unmatched.layer, &unmatched.name);
            self.missing.push(unmatched);
        }
        for unmatched in compared.extra {
            self.saw(unmatched.layer, &unmatched.name);
            self.extra.push(unmatched);
        }
        for warning in compared.warnings {
            self.warnings.push(warning);
        }
        if compared.pairs.is_empty() {
            return;
        }
        let mut row = PassRow {
            pass: pass.unwrap_or(0),
            worst_ratio: 0.0,
            diverged: 0,
        };
        let pairs: Vec<Judged> = (compared.pairs.into_iter())
            .map(|pair| {
                let floor = floors.map(|floors| {
                    let key = key_of(&pair);
                    let of = floors.get(&key).copied();
                    let of = of.unwrap_or(FloorOf::Without(NoFloor::Missing));
                    match of {
                        FloorOf::Without(why) => {
                            self.no_floor.push(NoFloorFor { tensor: key, why });
                        }
                        FloorOf::Error { rtol, exact }
                            if rtol > 0.0 && exact != pair.error.exact =>
                        {
                            self.unlike_floor.push(key);
                        }
                        FloorOf::Error { .. } => {}
                    }
                    of
                });
                Judged::new(pair, floor)
            })
            .collect();
        let first_before = self.first.is_some();
        for judged in &pairs {
            let pair = &judged.pair;
            self.counts.count(pair.verdict);
            self.saw(pair.layer, &pair.name);
            row.worst_ratio = row.worst_ratio.max(pair.ratio());
            if pair.verdict.is_divergence() {
                row.diverged += 1;
                let fed = self.inputs_fed && pair.name == "input";
                if self.first.is_none() && !fed {
                    self.first = Some(judged.clone());
                }
            }
        }
        let table = &mut self.table;
        let keep = match table.requested {
            Some(requested) => pass == Some(requested),
            None if first_before => false,
            None if self.first.is_some() => true,
            None => table.pass.is_none() || row.worst_ratio > table.worst_ratio,
        };
        if keep {
            table.pass = pass;
            table.worst_ratio = row.worst_ratio;
            table.pairs = pairs;
        }
        self.passes.push(row);
    }

    /// What is known only at the end: overrides that matched nothing, tensors out of order.
    fn finish(&mut self, options: &CompareOptions, reads: &[ReadPasses], runs: &[&TraceRun]) {
        self.unused_overrides = options.tolerances.unused_overrides(&self.names);
        for (seen, run) in self.other_tokens.iter().zip(&runs[1..]) {
            if let Some(first) = seen.first_counted {
                self.warnings.push(format!(
                    "{} more passes consumed other tokens in {} than in {}, the first of them \
                     pass {first}",
                    seen.passes - TOKEN_WARNINGS,
                    runs[0].label,
                    run.label
                ));
            }
        }
        for (read, run) in reads.iter().zip(runs) {
            if read.late > 0 {
                self.warnings.push(format!(
                    "{}: {} tensors came after their pass had been compared (the file is not in \
                     pass order) and were not compared",
                    run.label, read.late
                ));
            }
        }
        if self.table.pass.is_none() {
            self.table.pass = self.table.requested;
        }
    }
}

/// What `diff` reports, as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct Report<'a> {
    reference: &'a FileInfo,
    other: &'a FileInfo,
    tolerance: &'a Tolerances,
    /// The floor's trace (`--floor`), which set the rtol tensor by tensor; `null` without.
    floor: Option<&'a FileInfo>,
    /// How many times the floor's error the other may have; `null` without a floor.
    floor_factor: Option<f64>,
    compared: &'a Counts,
    /// `{pass, layer, stage}` of the first divergence in the reference's execution order, with
    /// what differs there; `null` when nothing diverged.
    pub(crate) first_divergence: Option<Divergence<'a>>,
    /// The first pass where the two runs chose different next tokens (from their final logits'
    /// best token, or the token their next pass consumed), with both sides' best tokens, the
    /// margins, the other's logits error and a verdict; `null` when they chose the same tokens
    /// in every pass where both choices are known.
    pub(crate) first_token_divergence: Option<&'a FirstTokenDivergence>,
    /// How many passes' choices were compared.
    pub(crate) token_passes_compared: usize,
    /// The pass the per-layer table is about.
    pub(crate) table_pass: usize,
    /// Per layer of that pass: the worst tensor.
    layers: Vec<LayerRow<'a>>,
    /// Per pass: the worst ratio and how many tensors diverged.
    pub(crate) passes: &'a [PassRow],
    /// Tensors only in the reference: the first [`LISTED`].
    missing: &'a [Unmatched],
    /// How many tensors are only in the reference.
    missing_count: usize,
    /// Tensors only in the other trace: the first [`LISTED`].
    extra: &'a [Unmatched],
    /// How many tensors are only in the other trace.
    extra_count: usize,
    /// Compared tensors the floor set no tolerance for (the given rtol judged them), and why:
    /// the first [`LISTED`].
    no_floor: &'a [NoFloorFor],
    /// How many compared tensors the floor set no tolerance for.
    no_floor_count: usize,
    /// Compared tensors whose error and the floor's were measured unlike (a warning says so).
    #[serde(skip)]
    unlike_floor: &'a Listed<TensorKey>,
    /// Captures that could not be read, tensors out of pass order and passes that consumed other
    /// tokens than the reference's (the first [`LISTED`]), then per-name overrides that matched
    /// no tensor.
    warnings: Vec<String>,
    /// How many warnings of the first kind there were.
    #[serde(skip)]
    read_warnings: usize,
    /// How many of `warnings` are of the first kind: the text shows those (the others go to
    /// stderr).
    #[serde(skip)]
    listed_read_warnings: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct FileInfo {
    path: String,
    writer: String,
    /// The rank files read together, for a run of several ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<usize>,
    tensors: usize,
    cut_short: Option<String>,
    /// The interventions that changed the run (its header's); empty: none.
    interventions: Vec<String>,
    /// The reference whose layer inputs an isolated run was fed.
    isolate: Option<String>,
    /// The trace's stage check (`model-trace check`): whether its stages obey the identities
    /// their names promise, on captured values where there are some, through the sketches
    /// elsewhere.
    stage_check: CheckVerdict,
}

#[derive(Debug, Default, Serialize)]
struct Counts {
    matched: usize,
    bit_identical: usize,
    close: usize,
    diverged: usize,
    shape_mismatch: usize,
}

impl Counts {
    fn count(&mut self, verdict: Verdict) {
        self.matched += 1;
        *match verdict {
            Verdict::BitIdentical => &mut self.bit_identical,
            Verdict::Close => &mut self.close,
            Verdict::Diverged => &mut self.diverged,
            Verdict::ShapeMismatch => &mut self.shape_mismatch,
        } += 1;
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Divergence<'a> {
    pub(crate) pass: usize,
    pub(crate) layer: usize,
    pub(crate) stage: &'a str,
    /// It is layer 0's `input`, the embeddings as the model scales them: before the first
    /// layer, computed by no layer (not drift inherited from one).
    pub(crate) before_first_layer: bool,
    seq: u64,
    #[serde(flatten)]
    detail: &'a Judged,
}

#[derive(Debug, Serialize)]
struct LayerRow<'a> {
    layer: usize,
    /// The tensor with the largest ratio.
    worst: &'a Judged,
    ratio: f64,
    /// The floor's error for that tensor (its `floor_rtol`); `null` without one.
    floor_rtol: Option<f64>,
    /// The other's error over the floor's, for that tensor: its `least_rtol` over its
    /// `floor_rtol` (0 where the other needs no rtol; `null` without a floor's error, or where
    /// the ratio is infinite: the other close at no rtol, or the floor needing none).
    floor_ratio: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PassRow {
    pub(crate) pass: usize,
    pub(crate) worst_ratio: f64,
    pub(crate) diverged: usize,
}

impl<'a> Report<'a> {
    fn new(
        files: &'a [FileInfo; 2],
        floor: Option<&'a FileInfo>,
        found: &'a Found,
        options: &'a CompareOptions,
    ) -> Self {
        let layers = worst_per_layer(&found.table.pairs);
        let no_floor = (found.no_floor.count > 0).then(|| {
            format!(
                "{} compared tensors have no floor and were judged by the given rtol",
                found.no_floor.count
            )
        });
        let unlike_floor = (found.unlike_floor.count > 0).then(|| unlike_text(&found.unlike_floor));
        Report {
            reference: &files[0],
            other: &files[1],
            tolerance: &options.tolerances,
            floor,
            floor_factor: found.floor_factor,
            compared: &found.counts,
            first_divergence: found.first.as_ref().map(|f| Divergence {
                pass: f.pair.pass,
                layer: f.pair.layer,
                stage: &f.pair.name,
                before_first_layer: before_first_layer(&f.pair),
                seq: f.pair.seq,
                detail: f,
            }),
            first_token_divergence: found.choices.first.as_ref(),
            token_passes_compared: found.choices.compared,
            table_pass: found.table.pass.unwrap_or(0),
            layers: (layers.into_iter())
                .map(|(layer, (worst, ratio))| LayerRow {
                    layer,
                    worst,
                    ratio,
                    floor_rtol: worst.floor_rtol,
                    floor_ratio: worst.floor_ratio().filter(|r| r.is_finite()),
                })
                .collect(),
            passes: &found.passes,
            missing: &found.missing.items,
            missing_count: found.missing.count,
            extra: &found.extra.items,
            extra_count: found.extra.count,
            no_floor: &found.no_floor.items,
            no_floor_count: found.no_floor.count,
            unlike_floor: &found.unlike_floor,
            warnings: (found.warnings.items.iter().cloned())
                .chain(no_floor)
                .chain(unlike_floor)
                .chain(found.unused_overrides.iter().map(ToString::to_string))
                .collect(),
            read_warnings: found.warnings.count,
            listed_read_warnings: found.warnings.items.len(),
        }
    }

    pub(crate) fn text(&self, colors: &Colors) -> String {
        let mut out = String::new();
        for (label, info) in [("reference:", self.reference), ("other:    ", self.other)] {
            let ranks = info
                .ranks
                .map_or_else(String::new, |n| format!(", {n} rank files"));
            let _ = writeln!(
                out,
                "{} {} ({}{ranks}, {} tensors)",
                colors.bold(label),
                info.path,
                info.writer,
                info.tensors
            );
        }
        let t = self.tolerance;
        let mut overrides = Vec::new();
        overrides.extend(
            t.atol_overrides
                .iter()
                .map(|(n, v)| format!("atol {v:e} for {n}")),
        );
        overrides.extend(
            t.rtol_overrides
                .iter()
                .map(|(n, v)| format!("rtol {v:e} for {n}")),
        );
        let stat_overrides: Vec<String> = t
            .error_stat_overrides
            .iter()
            .map(|(n, stat)| format!("{stat} for {n}"))
            .collect();
        let _ = writeln!(
            out,
            "{} atol {:e}, rtol {:e}{}; {} criterion{}",
            colors.bold("tolerance:"),
            t.default.atol,
            t.default.rtol,
            parenthesized(&overrides),
            t.error_stat,
            parenthesized(&stat_overrides)
        );
        if let (Some(floor), Some(factor)) = (self.floor, self.floor_factor) {
            let _ = writeln!(
                out,
                "{} {} ({}, {} tensors): each tensor's rtol is the larger of the given one and \
                 {factor} times the floor's error",
                colors.bold("floor:    "),
                floor.path,
                floor.writer,
                floor.tensors
            );
        }
        for (label, info) in [("reference", &self.reference), ("other", &self.other)] {
            if let Some(cut) = &info.cut_short {
                let _ = writeln!(out, "{}", colors.warn(&format!("{label} cut short: {cut}")));
            }
            if let Some(fed) = &info.isolate {
                let _ = writeln!(
                    out,
                    "{label} isolated: every layer was fed the inputs {fed} captured, so its \
                     errors are each layer's own"
                );
            } else if !info.interventions.is_empty() {
                let changes = crate::header::interventions_text(&info.interventions);
                let _ = writeln!(
                    out,
                    "{}",
                    colors.warn(&format!("{label} changed by: {changes}"))
                );
            }
        }
        let c = &self.compared;
        let _ = writeln!(
            out,
            "{} {} tensors: {} bit-identical, {} close, {} diverged, {} of another shape",
            colors.bold("matched:"),
            c.matched,
            c.bit_identical,
            c.close,
            if c.diverged > 0 {
                colors.bad(&c.diverged.to_string())
            } else {
                c.diverged.to_string()
            },
            if c.shape_mismatch > 0 {
                colors.bad(&c.shape_mismatch.to_string())
            } else {
                c.shape_mismatch.to_string()
            },
        );
        unmatched(
            &mut out,
            colors,
            "only in the reference",
            self.missing,
            self.missing_count,
        );
        unmatched(
            &mut out,
            colors,
            "only in the other",
            self.extra,
            self.extra_count,
        );
        listed(
            &mut out,
            colors,
            &format!(
                "warning: {} compared tensors have no floor, judged by the given rtol:",
                self.no_floor_count
            ),
            (self.no_floor.iter())
                .map(|n| format!("{} ({})", n.tensor.describe(), n.why.describe())),
            self.no_floor_count,
        );
        listed(
            &mut out,
            colors,
            &format!("warning: {}:", unlike_text(self.unlike_floor)),
            self.unlike_floor.items.iter().map(TensorKey::describe),
            self.unlike_floor.count,
        );
        for warning in &self.warnings[..self.listed_read_warnings] {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        if self.read_warnings > self.listed_read_warnings {
            let _ = writeln!(
                out,
                "{}",
                colors.warn(&format!(
                    "... and {} more warnings",
                    self.read_warnings - self.listed_read_warnings
                ))
            );
        }
        let _ = writeln!(out);
        match &self.first_divergence {
            None => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good("no divergence: every matched tensor is within tolerance")
                );
            }
            Some(d) => describe(&mut out, colors, d, self.tolerance, self.floor_factor),
        }
        if let Some(tokens) = self.first_token_divergence {
            let text = tokens.text();
            let _ = write!(
                out,
                "{}",
                match tokens.verdict {
                    TokenVerdict::NearTie => text,
                    _ => colors.bad(&text),
                }
            );
        } else if self.token_passes_compared > 1 {
            let _ = writeln!(
                out,
                "same tokens: both runs chose the same next token in all {} passes compared",
                self.token_passes_compared
            );
        }
        let _ = writeln!(out);
        self.layer_table(&mut out, colors);
        out
    }

    fn layer_table(&self, out: &mut String, colors: &Colors) {
        let diverged_passes = self.passes.iter().filter(|p| p.diverged > 0).count();
        if self.passes.len() > 1 {
            let _ = writeln!(
                out,
                "{} passes, {} with a divergence; the table is pass {} (--pass N for another)",
                self.passes.len(),
                diverged_passes,
                self.table_pass
            );
        }
        if self.floor_factor.is_some() {
            self.floor_table(out, colors);
            return;
        }
        let _ = writeln!(
            out,
            "{}",
            colors.bold("layer  worst tensor      ratio      rel. error    verdict")
        );
        for row in &self.layers {
            let pair = &row.worst.pair;
            let error = pair.error.relative_error.map_or_else(
                || "-".to_owned(),
                |e| format!("{}{e:.2e}", estimated(pair.error.exact)),
            );
            let _ = writeln!(
                out,
                "{:>5}  {:<16}  {:>9}  {:>12}    {}",
                row.layer,
                with_shard(&pair.name, pair.shard),
                ratio_text(row.ratio),
                error,
                verdict_text(colors, pair.verdict)
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim("(ratio: the largest difference over what the tolerance allows, above 1 out of tolerance; rel. error ‖b − a‖/‖a‖, ≈ when estimated from the sketches)")
        );
    }

    /// The per-layer table with a floor: each layer's worst tensor, the floor's error and the
    /// other's (the smallest rtol at which each is close to the reference), their ratio, and
    /// the rtol allowed.
    fn floor_table(&self, out: &mut String, colors: &Colors) {
        let line = |cells: [&str; 7], verdict: &str| {
            format!(
                "{:>5}  {:<16}  {:>9}  {:>10}  {:>10}  {:>11}  {:>12}    {verdict}",
                cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]
            )
        };
        let head = [
            "layer",
            "worst tensor",
            "ratio",
            "floor rtol",
            "other rtol",
            "other/floor",
            "allowed rtol",
        ];
        let _ = writeln!(out, "{}", colors.bold(&line(head, "verdict")));
        for row in &self.layers {
            let (judged, pair) = (row.worst, &row.worst.pair);
            let floor = match (judged.floor_rtol, judged.no_floor) {
                (Some(rtol), _) => rtol_text(Some(rtol), judged.floor_exact == Some(true)),
                (None, Some(_)) => "none".to_owned(),
                (None, None) => "-".to_owned(),
            };
            let other = match pair.verdict {
                Verdict::ShapeMismatch => "-".to_owned(),
                _ => rtol_text(pair.least_rtol, pair.error.exact),
            };
            let cells = [
                &row.layer.to_string(),
                &with_shard(&pair.name, pair.shard),
                &ratio_text(row.ratio),
                &floor,
                &other,
                &judged
                    .floor_ratio()
                    .map_or_else(|| "-".to_owned(), ratio_text),
                &format!("{:.2e}", pair.tolerance.rtol),
            ];
            let _ = writeln!(
                out,
                "{}",
                line(
                    cells.map(String::as_str),
                    &verdict_text(colors, pair.verdict)
                )
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim(
                "(floor rtol, other rtol: the smallest rtol at which the floor, the other, is \
                 close to the reference for that tensor, ≈ where summaries bound it; allowed \
                 rtol: the larger of the given and the floor factor times the floor's (none: \
                 no floor for it); ratio: the largest difference over what that allows)"
            )
        );
    }
}

/// What the tensors whose error and the floor's were measured unlike are.
fn unlike_text(unlike: &Listed<TensorKey>) -> String {
    format!(
        "{} compared tensors were compared by captures and the floor by summaries, or the \
         reverse: a bound from summaries is far below the captures' error under norm (about \
         √n times), so the floor sets their tolerance in other units than they are judged in \
         (--summaries-only compares like with like)",
        unlike.count
    )
}

/// `≈` for an estimate, nothing for an exact value.
fn estimated(exact: bool) -> &'static str {
    if exact {
        ""
    } else {
        "≈"
    }
}

/// A least rtol: `1.23e-3`, `≈1.23e-3` from summaries, `∞` where no rtol is enough.
fn rtol_text(rtol: Option<f64>, exact: bool) -> String {
    rtol.map_or_else(
        || "∞".to_owned(),
        |r| format!("{}{r:.2e}", estimated(exact)),
    )
}

fn verdict_text(colors: &Colors, verdict: Verdict) -> String {
    match verdict {
        Verdict::BitIdentical => colors.dim("bit-identical"),
        Verdict::Close => colors.good("close"),
        Verdict::Diverged => colors.bad("diverged"),
        Verdict::ShapeMismatch => colors.bad("shape mismatch"),
    }
}

/// ` (a, b)`, or nothing for no items.
fn parenthesized(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" ({})", items.join(", "))
    }
}

/// The first divergence; `tolerances` are the ones given (a tensor judged by another criterion
/// than their default says so), `floor_factor` the floor's factor where a floor set the rtol.
fn describe(
    out: &mut String,
    colors: &Colors,
    d: &Divergence<'_>,
    tolerances: &Tolerances,
    floor_factor: Option<f64>,
) {
    let p = &d.detail.pair;
    if d.before_first_layer {
        let _ = writeln!(
            out,
            "{} pass {}, {} (layer 0, {}; seq {} of the reference)",
            colors.bad("first divergence:"),
            d.pass,
            colors.bold("before the first layer: the embeddings"),
            with_shard(d.stage, p.shard),
            d.seq
        );
        let _ = writeln!(
            out,
            "  layer 0's input is the embeddings as the model scales them: no layer computed \
             it, so look at the embedding lookup and its scaling; every layer after it \
             inherits the difference"
        );
    } else {
        let _ = writeln!(
            out,
            "{} pass {}, layer {}, {} (seq {} of the reference)",
            colors.bad("first divergence:"),
            d.pass,
            d.layer,
            colors.bold(&with_shard(d.stage, p.shard)),
            d.seq
        );
    }
    if p.verdict == Verdict::ShapeMismatch {
        let _ = writeln!(
            out,
            "  shapes differ: reference {:?}, other {:?}",
            p.shapes.0, p.shapes.1
        );
        return;
    }
    let _ = writeln!(
        out,
        "  shape {:?}; tolerance atol {:e}, rtol {}{}; compared {}",
        p.shapes.0,
        p.tolerance.atol,
        number_text(p.tolerance.rtol),
        if p.error_stat == tolerances.error_stat {
            String::new()
        } else {
            format!(", {} criterion", p.error_stat)
        },
        if p.method == "elementwise" {
            "value by value (both captured)".to_owned()
        } else {
            summaries_compared(&p.checks)
        }
    );
    if let Some(factor) = floor_factor {
        floor_said(out, d.detail, tolerances, factor);
    }
    for check in p.checks.iter().filter(|c| c.ratio() > 1.0).take(6) {
        if check.what.starts_with("elements") {
            let _ = writeln!(
                out,
                "  {}: {:.3} times what the tolerance allows",
                check.what, check.difference
            );
        } else {
            let _ = writeln!(
                out,
                "  {:<12} reference {:<14} other {:<14} differs by {:.3e}, allowed {:.3e} ({})",
                check.what,
                format!("{:.6e}", check.reference),
                format!("{:.6e}", check.other),
                check.difference,
                check.allowed,
                ratio_text(check.ratio())
            );
        }
    }
    let failing = p.checks.iter().filter(|c| c.ratio() > 1.0).count();
    if failing > 6 {
        let _ = writeln!(
            out,
            "  ... and {} more checks out of tolerance",
            failing - 6
        );
    }
    let e = &p.error;
    let mut measures = Vec::new();
    if let Some(rel) = e.relative_error {
        measures.push(format!(
            "relative error {}{rel:.3e}",
            if e.exact { "" } else { "≈ " }
        ));
    }
    if let Some(v) = e.max_abs_error {
        measures.push(format!("max abs error {v:.3e}"));
    }
    if let Some(v) = e.max_rel_error {
        measures.push(format!("max rel error {v:.3e}"));
    }
    if let Some(v) = e.cosine {
        measures.push(format!("cosine {v:.6}"));
    }
    if let Some(v) = e.nmse_db {
        measures.push(format!("NMSE {v:.1} dB"));
    }
    if let Some((bad, all)) = e.mismatched {
        measures.push(format!("{bad} of {all} elements out of tolerance"));
    }
    if !measures.is_empty() {
        let _ = writeln!(out, "  {}", measures.join(", "));
    }
}

/// Where the rtol of `judged` came from, and its error against the floor's.
fn floor_said(out: &mut String, judged: &Judged, tolerances: &Tolerances, factor: f64) {
    let p = &judged.pair;
    let given = tolerances.for_name(&full_name(p.layer, &p.name)).rtol;
    let other = rtol_text(p.least_rtol, p.error.exact);
    let _ = match (judged.floor_rtol, judged.no_floor) {
        (Some(floor), _) => {
            let floor_error = format!(
                "{factor} times the floor's error {}",
                rtol_text(Some(floor), judged.floor_exact == Some(true))
            );
            let source = if p.tolerance.rtol > given {
                format!("is {floor_error} (more than the given {given:e})")
            } else {
                format!("as given (more than {floor_error})")
            };
            let ratio = judged.floor_ratio().map_or_else(|| "-".to_owned(), ratio_text);
            writeln!(
                out,
                "  rtol {} {source}; the other's error is {other}, {} times the floor's",
                number_text(p.tolerance.rtol),
                ratio.trim_end_matches('x')
            )
        }
        (None, why) => writeln!(
            out,
            "  rtol {given:e} as given: no floor for this tensor ({}); the other's error is {other}",
            why.map_or("none", NoFloor::describe)
        ),
    };
}

/// `1e-5` as given, `1.993e-3` for a number of many digits.
fn number_text(value: f64) -> String {
    let (all, short) = (format!("{value:e}"), format!("{value:.3e}"));
    if all.len() <= short.len() {
        all
    } else {
        short
    }
}

fn unmatched(out: &mut String, colors: &Colors, label: &str, list: &[Unmatched], count: usize) {
    let items = list.iter().map(Unmatched::describe);
    listed(out, colors, &format!("{count} {label}:"), items, count);
}

/// `label` and the first [`SHOWN_UNMATCHED`] of `count` items, then how many more; nothing
/// when there are none.
fn listed(
    out: &mut String,
    colors: &Colors,
    label: &str,
    items: impl Iterator<Item = String>,
    count: usize,
) {
    if count == 0 {
        return;
    }
    let shown: Vec<String> = items.take(SHOWN_UNMATCHED).collect();
    let more = count.saturating_sub(shown.len());
    let _ = writeln!(
        out,
        "{} {}{}",
        colors.warn(label),
        shown.join(", "),
        if more > 0 {
            format!(", ... and {more} more")
        } else {
            String::new()
        }
    );
}

/// `attn_out`, or `attn_out (rank 1's shard)`.
fn with_shard(name: &str, shard: Option<usize>) -> String {
    match shard {
        Some(rank) => format!("{name} (rank {rank}'s shard)"),
        None => name.to_owned(),
    }
}

/// Whether `pair` is layer 0's `input`: the embeddings as the model scales them, the record
/// before the first layer (docs/trace-format.md, the stage vocabulary).
pub(crate) fn before_first_layer(pair: &TensorComparison) -> bool {
    pair.layer == 0 && pair.name == "input"
}

/// The ratio of a pair for tables: 0 for bit-identical, infinite for a shape mismatch.
pub(crate) fn ratio_text(ratio: f64) -> String {
    if ratio.is_infinite() {
        "∞".to_owned()
    } else if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.3}")
    }
}

/// `by summaries (statistics, sketch, samples)`, naming only what both summaries had (a golden
/// file keeps statistics alone).
fn summaries_compared(checks: &[trace_runtime::compare::Check]) -> String {
    let had = |prefix: &str| checks.iter().any(|c| c.what.starts_with(prefix));
    let mut parts = vec!["statistics"];
    if had("sketch") {
        parts.push("sketch");
    }
    if had("head") || had("tail") {
        parts.push("samples");
    }
    format!("by summaries ({})", parts.join(", "))
}
