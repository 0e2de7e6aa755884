//! Two traces read and compared, and what that comparison reports (as text or JSON): what
//! `diff` prints, and what `report --against` puts on its page.
//!
//! The comparison streams: each trace is read on a thread of its own (the ranks of a run
//! merged pass by pass), each pass's tensors are handed on when the pass is complete, and the
//! passes are compared as they come, keeping only what the report needs: the counts, the first
//! divergence, one row per pass, the tensors of the pass the per-layer table is about, and the
//! first [`LISTED`] unmatched tensors and warnings of each kind. Memory does not grow with the
//! tensors of a pass times the passes.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use serde::Serialize;
use trace_runtime::compare::{
    compare, full_name, CompareOptions, ErrorStat, TensorComparison, TraceTensors, TracedTensor,
    Unmatched, UnusedOverride, Verdict,
};
use trace_runtime::{read_capture, CaptureError};

use crate::input::{TraceFile, TraceRun};
use crate::load::{self, InputError};
use crate::style::Colors;

/// Unmatched tensors listed in the text output before "... and N more".
const SHOWN_UNMATCHED: usize = 8;

/// Unmatched tensors (of each trace) and warnings kept for the JSON output; the others are
/// counted.
pub(crate) const LISTED: usize = 1000;

/// Passes read ahead of the comparison, per trace.
const PASSES_AHEAD: usize = 4;

/// Two traces read and compared.
pub(crate) struct Diffed {
    files: [FileInfo; 2],
    options: CompareOptions,
    found: Found,
}

impl Diffed {
    /// Reads both traces (one thread each) and compares them pass by pass, reading captured
    /// tensors where `options` says to. The per-layer table will be about `pass` (default: the
    /// first divergence's, else the one with the largest error).
    pub(crate) fn read(
        reference: &Path,
        other: &Path,
        options: CompareOptions,
        pass: Option<usize>,
    ) -> Result<Self, InputError> {
        let ref_run = TraceRun::open(&[reference.to_path_buf()])?;
        let other_run = TraceRun::open(&[other.to_path_buf()])?;
        ref_run.warn_missing_ranks();
        other_run.warn_missing_ranks();
        let mut found = Found::new(pass, &options);
        // An isolated run was fed the reference's layer inputs: they match by construction
        // (up to the run's own dtype), so its first divergence is sought among what the layers
        // computed.
        found.inputs_fed = other_run.header().isolate.is_some();
        let (ref_read, other_read) = std::thread::scope(|scope| {
            let (ref_tx, ref_rx) = sync_channel(PASSES_AHEAD);
            let (other_tx, other_rx) = sync_channel(PASSES_AHEAD);
            // Each reader owns its sender: when it ends, the comparison sees the end.
            let (ref_run, other_run) = (&ref_run, &other_run);
            let ref_read = scope.spawn(move || read_passes(ref_run, &ref_tx));
            let other_read = scope.spawn(move || read_passes(other_run, &other_tx));
            found.compare_passes(&ref_rx, &other_rx, &options);
            // A reader stopped by an error has dropped its sender; the other may still be
            // sending: stop listening so that it ends.
            drop((ref_rx, other_rx));
            let joined = |read: std::thread::ScopedJoinHandle<'_, _>| {
                read.join()
                    .unwrap_or_else(|_| Err("reading a trace failed".to_owned()))
            };
            (joined(ref_read), joined(other_read))
        });
        let (ref_read, other_read) = (ref_read?, other_read?);
        if ref_read.tensors == 0 {
            return Err(format!(
                "{}: no tensors to compare (no layer, attention or logits events)",
                ref_run.label
            ));
        }
        if found.counts.matched == 0 {
            return Err(format!(
                "no tensor of {} matches one of {} by (pass, layer, name); the names differ? \
                 (--map llama|bert|FILE renames them)",
                other_run.label, ref_run.label
            ));
        }
        found.finish(&options, [&ref_read, &other_read], [&ref_run, &other_run]);
        let info = |run: &TraceRun, read: ReadPasses| FileInfo {
            path: run.label.clone(),
            writer: run.header().writer.clone(),
            ranks: run.is_ranked().then_some(run.files.len()),
            tensors: read.tensors,
            cut_short: read.notes.truncation(),
            interventions: run.header().interventions.clone(),
            isolate: run.header().isolate.clone(),
        };
        Ok(Self {
            files: [info(&ref_run, ref_read), info(&other_run, other_read)],
            options,
            found,
        })
    }

    /// What to report.
    pub(crate) fn report(&self) -> Report<'_> {
        Report::new(&self.files, &self.found, &self.options)
    }

    /// Whether a tensor diverged.
    pub(crate) fn diverged(&self) -> bool {
        self.found.first.is_some()
    }

    /// The compared tensors of the pass the per-layer table is about.
    pub(crate) fn table_pairs(&self) -> &[TensorComparison] {
        &self.found.table.pairs
    }

    /// The pass the per-layer table is about.
    pub(crate) fn table_pass(&self) -> usize {
        self.found.table.pass.unwrap_or(0)
    }

    /// The first divergence (for an isolated run, the first among what the layers computed).
    pub(crate) fn first(&self) -> Option<&TensorComparison> {
        self.found.first.as_ref()
    }

    /// Per layer of the table's pass, its worst tensor and that tensor's ratio; an isolated
    /// run's layer inputs, fed from the reference, left out.
    pub(crate) fn worst_by_layer(&self) -> BTreeMap<usize, (&TensorComparison, f64)> {
        let mut layers: BTreeMap<usize, (&TensorComparison, f64)> = BTreeMap::new();
        for pair in &self.found.table.pairs {
            if self.found.inputs_fed && pair.name == "input" {
                continue;
            }
            let r = ratio(pair);
            let row = layers.entry(pair.layer).or_insert((pair, r));
            if r > row.1 {
                *row = (pair, r);
            }
        }
        layers
    }

    /// The reference file that an isolated other trace was fed, if it is one.
    pub(crate) fn other_isolated_from(&self) -> Option<&str> {
        self.files[1].isolate.as_deref()
    }

    /// Says on stderr which per-name overrides matched no tensor (the JSON output has them
    /// among its `warnings`).
    pub(crate) fn warn_unused_overrides(&self) {
        for unused in &self.found.unused_overrides {
            eprintln!("model-trace: warning: {unused}");
        }
    }
}

/// One pass's tensors of one trace (every rank's); `pass` is `None` for the attention records
/// made outside any pass, handed on at the end.
struct PassTensors {
    pass: Option<usize>,
    tensors: TraceTensors,
}

impl PassTensors {
    /// Passes in order, then the tensors outside any pass.
    fn order(&self) -> (bool, usize) {
        (self.pass.is_none(), self.pass.unwrap_or(0))
    }
}

/// What reading one trace for a comparison gave.
struct ReadPasses {
    notes: load::ReadNotes,
    /// Tensors read.
    tensors: usize,
    /// Tensors that came after their pass had been handed on (a file not in pass order).
    late: usize,
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
    let mut listening = true;
    let mut hand_on = |pass: Option<usize>, parts: &mut [TraceTensors]| {
        let tensors = TraceTensors::merge_ranks(parts.iter_mut().map(TraceTensors::take));
        if listening && !tensors.tensors.is_empty() {
            listening = send.send(PassTensors { pass, tensors }).is_ok();
        }
    };
    let notes = load::read(run, |file, event| {
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
                    hand_on(c, &mut pending);
                }
                current = Some(p);
                let before = pending[at].tensors.len();
                pending[at].push(event);
                tensors += pending[at].tensors.len() - before;
            }
        }
    })?;
    hand_on(current, &mut pending);
    tensors += outside.iter().map(|t| t.tensors.len()).sum::<usize>();
    hand_on(None, &mut outside);
    Ok(ReadPasses {
        notes,
        tensors,
        late,
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
fn captured(_: &TraceTensors, tensor: &TracedTensor) -> Option<Result<Vec<f32>, CaptureError>> {
    let capture = tensor.tensor.capture.as_ref()?;
    let file = tensor.file.as_ref()?;
    Some(read_capture(file, capture).map(|(_, values)| values))
}

/// What the comparison found so far, folded pass by pass.
#[derive(Debug, Default)]
struct Found {
    counts: Counts,
    first: Option<TensorComparison>,
    passes: Vec<PassRow>,
    table: Table,
    missing: Listed<Unmatched>,
    extra: Listed<Unmatched>,
    /// Captures that could not be read, tensors read out of pass order.
    warnings: Listed<String>,
    /// Full names (after renaming) of every tensor of either trace: which overrides matched
    /// (kept only when there are overrides).
    names: HashSet<String>,
    track_names: bool,
    unused_overrides: Vec<UnusedOverride>,
    /// The other trace is an isolated run: layer inputs are not candidates for the first
    /// divergence.
    inputs_fed: bool,
}

/// The pass of the per-layer table and its compared tensors.
#[derive(Debug, Default)]
struct Table {
    /// The pass asked for.
    requested: Option<usize>,
    pass: Option<usize>,
    pairs: Vec<TensorComparison>,
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
    fn new(pass: Option<usize>, options: &CompareOptions) -> Self {
        let t = &options.tolerances;
        Self {
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

    /// Compares the passes the two readers send, matching them by pass number.
    fn compare_passes(
        &mut self,
        reference: &Receiver<PassTensors>,
        other: &Receiver<PassTensors>,
        options: &CompareOptions,
    ) {
        let (mut a, mut b) = (reference.recv().ok(), other.recv().ok());
        loop {
            let (ref_pass, other_pass) = match (a.take(), b.take()) {
                (None, None) => break,
                (Some(x), Some(y)) if x.order() == y.order() => {
                    (a, b) = (reference.recv().ok(), other.recv().ok());
                    (Some(x), Some(y))
                }
                (Some(x), y) if y.as_ref().is_none_or(|y| x.order() < y.order()) => {
                    (a, b) = (reference.recv().ok(), y);
                    (Some(x), None)
                }
                (x, y) => {
                    (a, b) = (x, other.recv().ok());
                    (None, y)
                }
            };
            let empty = TraceTensors::default();
            let pass = ref_pass
                .as_ref()
                .or(other_pass.as_ref())
                .and_then(|p| p.pass);
            let compared = compare(
                ref_pass.as_ref().map_or(&empty, |p| &p.tensors),
                other_pass.as_ref().map_or(&empty, |p| &p.tensors),
                options,
                captured,
            );
            self.fold(pass, compared);
        }
    }

    /// Folds one pass's comparison in.
    fn fold(&mut self, pass: Option<usize>, compared: trace_runtime::compare::Comparison) {
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
        let first_before = self.first.is_some();
        for pair in &compared.pairs {
            self.counts.count(pair.verdict);
            self.saw(pair.layer, &pair.name);
            row.worst_ratio = row.worst_ratio.max(ratio(pair));
            if pair.verdict.is_divergence() {
                row.diverged += 1;
                let fed = self.inputs_fed && pair.name == "input";
                if self.first.is_none() && !fed {
                    self.first = Some(pair.clone());
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
            table.pairs = compared.pairs;
        }
        self.passes.push(row);
    }

    /// What is known only at the end: overrides that matched nothing, tensors out of order.
    fn finish(&mut self, options: &CompareOptions, read: [&ReadPasses; 2], runs: [&TraceRun; 2]) {
        self.unused_overrides = options.tolerances.unused_overrides(&self.names);
        for (read, run) in read.iter().zip(runs) {
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
    tolerance: &'a trace_runtime::compare::Tolerances,
    compared: &'a Counts,
    /// `{pass, layer, stage}` of the first divergence in the reference's execution order, with
    /// what differs there; `null` when nothing diverged.
    pub(crate) first_divergence: Option<Divergence<'a>>,
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
    /// Captures that could not be read and tensors out of pass order (the first [`LISTED`]),
    /// then per-name overrides that matched no tensor.
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
    seq: u64,
    #[serde(flatten)]
    detail: &'a TensorComparison,
}

#[derive(Debug, Serialize)]
struct LayerRow<'a> {
    layer: usize,
    worst: &'a TensorComparison,
    ratio: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct PassRow {
    pub(crate) pass: usize,
    pub(crate) worst_ratio: f64,
    pub(crate) diverged: usize,
}

impl<'a> Report<'a> {
    fn new(files: &'a [FileInfo; 2], found: &'a Found, options: &'a CompareOptions) -> Self {
        let mut layers: BTreeMap<usize, LayerRow<'a>> = BTreeMap::new();
        for pair in &found.table.pairs {
            let r = ratio(pair);
            let row = layers.entry(pair.layer).or_insert(LayerRow {
                layer: pair.layer,
                worst: pair,
                ratio: r,
            });
            if r > row.ratio {
                row.worst = pair;
                row.ratio = r;
            }
        }
        Report {
            reference: &files[0],
            other: &files[1],
            tolerance: &options.tolerances,
            compared: &found.counts,
            first_divergence: found.first.as_ref().map(|f| Divergence {
                pass: f.pass,
                layer: f.layer,
                stage: &f.name,
                seq: f.seq,
                detail: f,
            }),
            table_pass: found.table.pass.unwrap_or(0),
            layers: layers.into_values().collect(),
            passes: &found.passes,
            missing: &found.missing.items,
            missing_count: found.missing.count,
            extra: &found.extra.items,
            extra_count: found.extra.count,
            warnings: (found.warnings.items.iter().cloned())
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
            Some(d) => describe(&mut out, colors, d, self.tolerance.error_stat),
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
        let _ = writeln!(
            out,
            "{}",
            colors.bold("layer  worst tensor      ratio      rel. error    verdict")
        );
        for row in &self.layers {
            let pair = row.worst;
            let error = pair.error.relative_error.map_or_else(
                || "-".to_owned(),
                |e| format!("{}{e:.2e}", if pair.error.exact { "" } else { "≈" }),
            );
            let verdict = match pair.verdict {
                Verdict::BitIdentical => colors.dim("bit-identical"),
                Verdict::Close => colors.good("close"),
                Verdict::Diverged => colors.bad("diverged"),
                Verdict::ShapeMismatch => colors.bad("shape mismatch"),
            };
            let _ = writeln!(
                out,
                "{:>5}  {:<16}  {:>9}  {:>12}    {verdict}",
                row.layer,
                with_shard(&pair.name, pair.shard),
                ratio_text(row.ratio),
                error
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim("(ratio: the largest difference over what the tolerance allows, above 1 out of tolerance; rel. error ‖b − a‖/‖a‖, ≈ when estimated from the sketches)")
        );
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

/// The first divergence; `error_stat` is the default criterion (a tensor judged by another
/// says so).
fn describe(out: &mut String, colors: &Colors, d: &Divergence<'_>, error_stat: ErrorStat) {
    let p = d.detail;
    let _ = writeln!(
        out,
        "{} pass {}, layer {}, {} (seq {} of the reference)",
        colors.bad("first divergence:"),
        d.pass,
        d.layer,
        colors.bold(&with_shard(d.stage, p.shard)),
        d.seq
    );
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
        "  shape {:?}; tolerance atol {:e}, rtol {:e}{}; compared {}",
        p.shapes.0,
        p.tolerance.atol,
        p.tolerance.rtol,
        if p.error_stat == error_stat {
            String::new()
        } else {
            format!(", {} criterion", p.error_stat)
        },
        if p.method == "elementwise" {
            "value by value (both captured)"
        } else {
            "by summaries (statistics, sketch, samples)"
        }
    );
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

fn unmatched(out: &mut String, colors: &Colors, label: &str, list: &[Unmatched], count: usize) {
    if count == 0 {
        return;
    }
    let shown: Vec<String> = list
        .iter()
        .take(SHOWN_UNMATCHED)
        .map(Unmatched::describe)
        .collect();
    let more = count.saturating_sub(shown.len());
    let _ = writeln!(
        out,
        "{} {}{}",
        colors.warn(&format!("{count} {label}:")),
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

/// The ratio of a pair for tables: 0 for bit-identical, infinite for a shape mismatch.
pub(crate) fn ratio(pair: &TensorComparison) -> f64 {
    match pair.verdict {
        Verdict::ShapeMismatch => f64::INFINITY,
        _ => pair.worst_ratio(),
    }
}

pub(crate) fn ratio_text(ratio: f64) -> String {
    if ratio.is_infinite() {
        "∞".to_owned()
    } else if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.3}")
    }
}
