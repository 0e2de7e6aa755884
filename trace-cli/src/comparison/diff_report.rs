//! What a comparison reports: the traces, the tolerances, the counts, the first divergence,
//! the first token divergence, the per-layer table, the passes, the unmatched tensors and the
//! warnings, as `diff --json` writes them (`text` writes them for a reader).

use serde::Serialize;
use trace_runtime::compare::{CompareOptions, TensorKey, Tolerances, Unmatched};

use super::default_tolerance::ToleranceChoice;
use super::findings::{Findings, FirstItems, PassRow, VerdictCounts};
use super::floor::{TensorJudgement, TensorWithoutFloor};
use super::routing::RoutingReport;
use super::split::SplitReport;
use super::stream::ReaderTally;
use super::tokens::FirstTokenDivergence;
use super::{before_first_layer, worst_per_layer};
use crate::input::TraceRun;
use crate::stage_check::CheckVerdict;

/// What `diff` reports, as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct DiffReport<'a> {
    pub(super) reference: &'a FileInfo,
    pub(super) other: &'a FileInfo,
    pub(super) tolerance: &'a Tolerances,
    /// Where the tolerance came from: given, or chosen from the two headers' precisions, and
    /// why.
    pub(super) tolerance_choice: &'a ToleranceChoice,
    /// The floor's trace (`--floor`), which set the rtol tensor by tensor; `null` without.
    pub(super) floor: Option<&'a FileInfo>,
    /// How many times the floor's error the other may have; `null` without a floor.
    pub(super) floor_factor: Option<f64>,
    pub(super) compared: &'a VerdictCounts,
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
    pub(super) layers: Vec<LayerRow<'a>>,
    /// Per pass: the worst ratio and how many tensors diverged.
    pub(crate) passes: &'a [PassRow],
    /// The routers compared (`model-trace diff`'s routing): per layer the tokens routed
    /// differently and how, and the first token routed differently; absent when neither trace
    /// has router calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) routing: Option<&'a RoutingReport>,
    /// With `--quantized`: the error split of the table's pass, layer by layer and tensor by
    /// tensor, and the identity's residual over the run; `null` without.
    pub(super) split: Option<SplitReport<'a>>,
    /// Tensors only in the reference: the first [`LISTED`](super::LISTED).
    pub(super) missing: &'a [Unmatched],
    /// How many tensors are only in the reference.
    pub(super) missing_count: usize,
    /// Tensors only in the other trace: the first [`LISTED`](super::LISTED).
    pub(super) extra: &'a [Unmatched],
    /// How many tensors are only in the other trace.
    pub(super) extra_count: usize,
    /// Compared tensors the floor set no tolerance for (the given rtol judged them), and why:
    /// the first [`LISTED`](super::LISTED).
    pub(super) no_floor: &'a [TensorWithoutFloor],
    /// How many compared tensors the floor set no tolerance for.
    pub(super) no_floor_count: usize,
    /// Compared tensors whose error and the floor's were measured unlike (a warning says so).
    #[serde(skip)]
    pub(super) unlike_floor: &'a FirstItems<TensorKey>,
    /// Captures that could not be read, tensors out of pass order and passes that consumed other
    /// tokens than the reference's (the first [`LISTED`](super::LISTED)), then per-name overrides that matched
    /// no tensor.
    pub(super) warnings: Vec<String>,
    /// How many warnings of the first kind there were.
    #[serde(skip)]
    pub(super) read_warnings: usize,
    /// How many of `warnings` are of the first kind: the text shows those (the others go to
    /// stderr).
    #[serde(skip)]
    pub(super) listed_read_warnings: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct FileInfo {
    pub(super) path: String,
    pub(super) writer: String,
    /// The rank files read together, for a run of several ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ranks: Option<usize>,
    pub(super) tensors: usize,
    pub(super) cut_short: Option<String>,
    /// The interventions that changed the run (its header's); empty: none.
    pub(super) interventions: Vec<String>,
    /// The reference whose layer inputs an isolated run was fed.
    pub(super) isolate: Option<String>,
    /// The trace's stage check (`model-trace check`): whether its stages obey the identities
    /// their names promise, on captured values where there are some, through the sketches
    /// elsewhere.
    pub(super) stage_check: CheckVerdict,
}

#[derive(Debug, Serialize)]
pub(crate) struct Divergence<'a> {
    pub(crate) pass: usize,
    pub(crate) layer: usize,
    pub(crate) stage: &'a str,
    /// It is layer 0's `input`, the embeddings as the model scales them: before the first
    /// layer, computed by no layer (not drift inherited from one).
    pub(crate) before_first_layer: bool,
    pub(super) seq: u64,
    /// It is the first tensor compared.
    #[serde(skip)]
    pub(super) first_compared: bool,
    #[serde(flatten)]
    pub(super) detail: &'a TensorJudgement,
}

#[derive(Debug, Serialize)]
pub(super) struct LayerRow<'a> {
    pub(super) layer: usize,
    /// The tensor with the largest ratio.
    pub(super) worst: &'a TensorJudgement,
    pub(super) ratio: f64,
    /// The floor's error for that tensor (its `floor_rtol`); `null` without one.
    pub(super) floor_rtol: Option<f64>,
    /// The other's error over the floor's, for that tensor: its `least_rtol` over its
    /// `floor_rtol` (0 where the other needs no rtol; `null` without a floor's error, or where
    /// the ratio is infinite: the other close at no rtol, or the floor needing none).
    pub(super) floor_ratio: Option<f64>,
}

impl<'a> DiffReport<'a> {
    pub(super) fn new(
        files: &'a [FileInfo; 2],
        floor: Option<&'a FileInfo>,
        findings: &'a Findings,
        options: &'a CompareOptions,
        tolerance_choice: &'a ToleranceChoice,
        split: Option<SplitReport<'a>>,
    ) -> Self {
        let layers = worst_per_layer(&findings.table.pairs);
        let no_floor = (findings.no_floor.count > 0).then(|| {
            format!(
                "{} compared tensors have no floor and were judged by the given rtol",
                findings.no_floor.count
            )
        });
        let unlike_floor =
            (findings.unlike_floor.count > 0).then(|| unlike_text(&findings.unlike_floor));
        DiffReport {
            reference: &files[0],
            other: &files[1],
            tolerance: &options.tolerances,
            tolerance_choice,
            floor,
            floor_factor: findings.floor_factor,
            compared: &findings.counts,
            first_divergence: findings.first.as_ref().map(|f| Divergence {
                pass: f.pair.pass,
                layer: f.pair.layer,
                stage: &f.pair.name,
                before_first_layer: before_first_layer(&f.pair),
                seq: f.pair.seq,
                first_compared: findings.first_is_first_compared,
                detail: f,
            }),
            first_token_divergence: findings.choices.first.as_ref(),
            token_passes_compared: findings.choices.compared,
            table_pass: findings.table.pass.unwrap_or(0),
            layers: (layers.into_iter())
                .map(|(layer, (worst, ratio))| LayerRow {
                    layer,
                    worst,
                    ratio,
                    floor_rtol: worst.floor_rtol,
                    floor_ratio: worst.floor_ratio().filter(|r| r.is_finite()),
                })
                .collect(),
            passes: &findings.passes,
            routing: findings.routing.report(),
            split,
            missing: &findings.missing.items,
            missing_count: findings.missing.count,
            extra: &findings.extra.items,
            extra_count: findings.extra.count,
            no_floor: &findings.no_floor.items,
            no_floor_count: findings.no_floor.count,
            unlike_floor: &findings.unlike_floor,
            warnings: (findings.warnings.items.iter().cloned())
                .chain(no_floor)
                .chain(unlike_floor)
                .chain(findings.unused_overrides.iter().map(ToString::to_string))
                .collect(),
            read_warnings: findings.warnings.count,
            listed_read_warnings: findings.warnings.items.len(),
        }
    }
}

impl FileInfo {
    /// What the report says of `run`, read as `tally` says.
    pub(super) fn new(run: &TraceRun, tally: &ReaderTally) -> Self {
        Self {
            path: run.label.clone(),
            writer: run.header().writer.clone(),
            ranks: run.is_ranked().then_some(run.files.len()),
            tensors: tally.tensors,
            cut_short: tally.notes.truncation(),
            interventions: run.header().interventions.clone(),
            isolate: run.header().isolate.clone(),
            stage_check: tally.stage_check.clone(),
        }
    }
}

/// What the tensors whose error and the floor's were measured unlike are.
pub(super) fn unlike_text(unlike: &FirstItems<TensorKey>) -> String {
    format!(
        "{} compared tensors were compared by captures and the floor by summaries, or the \
         reverse: a bound from summaries is far below the captures' error under norm (about \
         √n times), so the floor sets their tolerance in other units than they are judged in \
         (--summaries-only compares like with like)",
        unlike.count
    )
}
