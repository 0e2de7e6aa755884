//! Two traces compared: what `diff` prints, and what `report --against` puts on its page.
//!
//! The comparison streams, one idea a file in the order the work goes: `stream` reads each trace on
//! a thread of its own (the ranks of a run merged pass by pass) and hands each pass's tensors on
//! when the pass is complete; `findings` compares the passes as they come and folds them into what
//! the report needs (the counts, the first divergence, one row per pass, the tensors of the pass
//! the per-layer table is about, and the first [`LISTED`] unmatched tensors and warnings of each
//! kind), with the tolerance a floor's trace sets each tensor (`floor`) and the tokens each run
//! chose (`tokens`); `diff_report` is what the comparison reports (the JSON) and `text` how it
//! reads; `isolated` sets an isolated run's errors beside the plain run's, layer by layer (`diff
//! --isolated`); `positions` compares runs of one model row by row at each token's position, when
//! their passes differ (`diff --by-position`, `diff --batch`). Memory does not grow with the
//! tensors of a pass times the passes.
//!
//! Two additions ride on the same reading: `default_tolerance` chooses the tolerance from the
//! traces' headers where the user gives none, and `split` splits the error of a quantized run
//! of the port into the quantization's part and the logic's (`diff --quantized`).

pub(crate) mod default_tolerance;
mod diff_report;
mod findings;
mod floor;
pub(crate) mod isolated;
pub(crate) mod positions;
pub(crate) mod routing;
pub(crate) mod split;
mod stream;
mod text;
pub(crate) mod tokens;

use std::collections::BTreeMap;
use std::path::Path;

use trace_runtime::compare::{CompareOptions, TensorComparison};

use self::default_tolerance::ToleranceChoice;
pub(crate) use self::diff_report::DiffReport;
use self::diff_report::FileInfo;
use self::findings::Findings;
pub(crate) use self::floor::{Floor, TensorJudgement};
use self::split::{PassSplit, Splitter};
use self::stream::ReaderTally;
use self::text::ratio_text;
use crate::input::{InputError, TraceRun};
use crate::precision::WeightsSaid;

/// Unmatched tensors (of each trace) and warnings kept for the JSON output; the others are
/// counted.
pub(crate) const LISTED: usize = 1000;

/// The traces of a comparison: the reference and the other, a floor's trace where one sets
/// the tolerances, and the other run on quantized weights where its error is split.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComparedTraces<'a> {
    pub(crate) reference: &'a Path,
    pub(crate) other: &'a Path,
    pub(crate) floor: Option<Floor<'a>>,
    /// The other run on quantized weights (`--quantized`).
    pub(crate) quantized: Option<&'a Path>,
}

/// How to compare: the runtime's options, and whether their tolerances are decided.
#[derive(Debug, Clone)]
pub(crate) struct CompareSettings {
    pub(crate) options: CompareOptions,
    /// `Some` where the tolerances are decided (given on the command line, or chosen for an
    /// earlier comparison of the same reference); `None`: chosen from the traces' headers.
    pub(crate) choice: Option<ToleranceChoice>,
}

/// Two traces read and compared, with a floor's trace where one sets the tolerances and a
/// quantized run where the error is split.
pub(crate) struct TraceComparison {
    files: [FileInfo; 2],
    floor: Option<FileInfo>,
    quantized: Option<FileInfo>,
    options: CompareOptions,
    choice: ToleranceChoice,
    /// What the headers say against the split's premise.
    split_warnings: Vec<String>,
    findings: Findings,
}

impl TraceComparison {
    /// Reads the traces (one thread each) and compares them pass by pass, reading captured
    /// tensors where the options say to, with the tolerance `settings` decide or (none
    /// decided) the one the two headers' precisions call for; with a floor, compares it with
    /// the reference first, pass by pass, and judges the other by the tolerances it sets; with
    /// a quantized run, splits the error. The per-layer table will be about `pass` (default:
    /// the first divergence's, else the one with the largest error).
    pub(crate) fn read(
        traces: ComparedTraces<'_>,
        settings: CompareSettings,
        pass: Option<usize>,
    ) -> Result<Self, InputError> {
        let open = |path: &Path| TraceRun::open(&[path.to_path_buf()]);
        let ref_run = open(traces.reference)?;
        let other_run = open(traces.other)?;
        let floor_run = traces.floor.map(|f| open(f.path)).transpose()?;
        let quantized_run = traces.quantized.map(open).transpose()?;
        let runs: Vec<&TraceRun> = [Some(&ref_run), Some(&other_run)]
            .into_iter()
            .chain([floor_run.as_ref(), quantized_run.as_ref()])
            .flatten()
            .collect();
        for run in &runs {
            run.warn_missing_ranks();
        }
        let CompareSettings {
            mut options,
            choice,
        } = settings;
        let choice = choice
            .unwrap_or_else(|| ToleranceChoice::from_headers(ref_run.header(), other_run.header()));
        choice.apply(&mut options.tolerances);
        let mut findings = Findings::new(pass, &options, traces.floor.map(|f| f.factor));
        // An isolated run was fed the reference's layer inputs: they match by construction
        // (up to the run's own dtype), so its first divergence is sought among what the layers
        // computed.
        findings.inputs_fed = other_run.header().isolate.is_some();
        findings.split = quantized_run
            .is_some()
            .then(|| Splitter::new(runs.len() - 1));
        let labels: Vec<&str> = runs.iter().map(|run| run.label.as_str()).collect();
        let tallies = stream::read_aligned(&runs, |passes| {
            findings.compare_passes(passes, &options, &labels);
        })?;
        something_compared(&runs, &tallies, &findings, floor_run.is_some())?;
        findings.finish(&options, &tallies, &runs);
        let info = |at: usize| FileInfo::new(runs[at], &tallies[at]);
        let split_warnings = quantized_run.as_ref().map_or_else(Vec::new, |quantized| {
            split::premise_warnings(
                (&WeightsSaid::of(other_run.header()), &other_run.label),
                (&WeightsSaid::of(quantized.header()), &quantized.label),
            )
        });
        Ok(Self {
            files: [info(0), info(1)],
            floor: floor_run.is_some().then(|| info(2)),
            quantized: quantized_run.is_some().then(|| info(runs.len() - 1)),
            options,
            choice,
            split_warnings,
            findings,
        })
    }

    /// What to report.
    pub(crate) fn report(&self) -> DiffReport<'_> {
        DiffReport::new(
            &self.files,
            self.floor.as_ref(),
            &self.findings,
            &self.options,
            &self.choice,
            self.split_report(),
        )
    }

    /// The error split's report, with a quantized run.
    fn split_report(&self) -> Option<split::SplitReport<'_>> {
        let quantized = self.quantized.as_ref()?;
        let splitter = self.findings.split.as_ref()?;
        Some(split::SplitReport {
            quantized,
            table_pass: self.table_pass(),
            layers: self.table_split().layers(),
            table_pass_other_tokens: self.table_split().other_tokens,
            tensors: &self.table_split().tensors,
            tally: &splitter.tally,
            warnings: &self.split_warnings,
        })
    }

    /// The settings this comparison was made with, its tolerance decided: for another
    /// comparison with the same reference to judge alike (an isolated run's).
    pub(crate) fn settings(&self) -> CompareSettings {
        CompareSettings {
            options: self.options.clone(),
            choice: Some(self.choice.clone()),
        }
    }

    /// The error split of the table's pass (empty without a quantized run).
    pub(crate) fn table_split(&self) -> &PassSplit {
        &self.findings.table.split
    }

    /// Whether a tensor diverged.
    pub(crate) fn diverged(&self) -> bool {
        self.findings.first.is_some()
    }

    /// The compared tensors of the pass the per-layer table is about.
    pub(crate) fn table_pairs(&self) -> &[TensorJudgement] {
        &self.findings.table.pairs
    }

    /// The pass the per-layer table is about.
    pub(crate) fn table_pass(&self) -> usize {
        self.findings.table.pass.unwrap_or(0)
    }

    /// A routing layer is flagged: `diff` exits 1 for it as for a divergence.
    pub(crate) fn routing_flagged(&self) -> bool {
        self.routing().is_some_and(|r| r.first_flagged().is_some())
    }

    /// The routers compared; `None` when neither trace has router calls.
    pub(crate) fn routing(&self) -> Option<&routing::RoutingReport> {
        self.findings.routing.report()
    }

    /// The first divergence (for an isolated run, the first among what the layers computed).
    pub(crate) fn first(&self) -> Option<&TensorComparison> {
        self.findings.first.as_ref().map(|first| &first.pair)
    }

    /// The floor's trace, and how many times its error the other may have.
    pub(crate) fn floor(&self) -> Option<(&str, f64)> {
        let file = self.floor.as_ref()?;
        Some((&file.path, self.findings.floor_factor?))
    }

    /// Per layer of the table's pass, its worst tensor and that tensor's ratio; an isolated
    /// run's layer inputs, fed from the reference, left out.
    pub(crate) fn worst_by_layer(&self) -> BTreeMap<usize, (&TensorComparison, f64)> {
        let fed =
            |judged: &&TensorJudgement| self.findings.inputs_fed && judged.pair.name == "input";
        let computed = self
            .findings
            .table
            .pairs
            .iter()
            .filter(|judged| !fed(judged));
        (worst_per_layer(computed).into_iter())
            .map(|(layer, (judged, ratio))| (layer, (&judged.pair, ratio)))
            .collect()
    }

    /// The reference file that an isolated other trace was fed, if it is one.
    pub(crate) fn other_isolated_from(&self) -> Option<&str> {
        self.files[1].isolate.as_deref()
    }

    /// A warning per trace (the reference, the other, the floor, the quantized run) that
    /// fails the stage check: a wrong stage map must not pass for a numeric divergence.
    pub(crate) fn stage_check_warnings(&self) -> Vec<String> {
        let sides = [
            ("the reference", Some(&self.files[0])),
            ("the other trace", Some(&self.files[1])),
            ("the floor", self.floor.as_ref()),
            ("the quantized run", self.quantized.as_ref()),
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
        for unused in &self.findings.unused_overrides {
            eprintln!("model-trace: warning: {unused}");
        }
    }
}

/// Per layer, the tensor of `pairs` with the largest ratio (the first of equals), and that ratio.
fn worst_per_layer<'a>(
    pairs: impl IntoIterator<Item = &'a TensorJudgement>,
) -> BTreeMap<usize, (&'a TensorJudgement, f64)> {
    let mut layers: BTreeMap<usize, (&TensorJudgement, f64)> = BTreeMap::new();
    for judged in pairs {
        let r = judged.pair.ratio();
        let row = layers.entry(judged.pair.layer).or_insert((judged, r));
        if r > row.1 {
            *row = (judged, r);
        }
    }
    layers
}

/// An error when nothing could be compared: the reference has no tensors, or no tensor of the
/// other trace (or of the floor, the third of `runs` where `floor`) matches one of it.
fn something_compared(
    runs: &[&TraceRun],
    tallies: &[ReaderTally],
    findings: &Findings,
    floor: bool,
) -> Result<(), InputError> {
    let reference = runs[0];
    if tallies[0].tensors == 0 {
        return Err(format!(
            "{}: no tensors to compare (no layer, attention or logits events)",
            reference.label
        ));
    }
    if findings.counts.matched == 0 {
        return Err(no_match(runs[1], reference));
    }
    match runs.get(2) {
        Some(run) if floor && findings.floor_matched == 0 => Err(no_match(run, reference)),
        _ => Ok(()),
    }
}

/// Why nothing was compared: no tensor of `run` matches one of `reference`.
fn no_match(run: &TraceRun, reference: &TraceRun) -> InputError {
    format!(
        "no tensor of {} matches one of {} by (pass, layer, name); the names differ? \
         (--map llama|bert|FILE renames them)",
        run.label, reference.label
    )
}

/// Whether `pair` is layer 0's `input`: the embeddings as the model scales them, the record
/// before the first layer (docs/trace-format.md, the stage vocabulary).
pub(crate) fn before_first_layer(pair: &TensorComparison) -> bool {
    pair.layer == 0 && pair.name == "input"
}
