//! Comparing two traces of the same computation: which tensors match, by how much they differ,
//! and where the first one diverges. `model-trace diff` is a front end of this module.
//!
//! Tensors are matched by (pass, layer, name), after a [`NameMap`]. Each pair gets one verdict:
//! bit-identical (equal fingerprints), close, diverged, or a shape mismatch. When both were
//! captured in full, the values decide ([`ErrorStat`]); otherwise the recorded summaries do,
//! through bounds that hold for every pair of tensors close in the sense of
//! `|b − a| ≤ atol + rtol·|a|` (docs/trace-format.md derives them): a summary outside its
//! bound proves the tensors are not close, so a divergence found this way is never a false
//! alarm (two tensors the bounds call close may still differ where the summaries cannot see).
//!
//! Reading captured tensors is the caller's: [`compare`] asks a loader it is given for the
//! values of each pair, so this module reads no file.

mod bounds;
pub mod by_position;
mod elementwise;
mod names;
mod tolerance;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use names::{full_name, split_full_name, NameMap, NameMapError};
pub use tolerance::{
    ErrorStat, Overridden, Tolerance, ToleranceError, Tolerances, UnusedOverride, DEFAULT_ATOL,
    DEFAULT_ERROR_QUANTILE, DEFAULT_RTOL,
};

use crate::record::{Event, TraceHeader};
use crate::summary::TensorSummary;

/// One tensor of a trace, as comparisons see it.
#[derive(Debug, Clone, PartialEq)]
pub struct TracedTensor {
    /// Its sequence number: the order its session computed it in.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The stage, `attention` or `logits`.
    pub name: String,
    /// What record it came from.
    pub kind: TensorKind,
    /// The summary.
    pub tensor: TensorSummary,
    /// The rank that recorded it, in a run of several ranks (the header's `rank`).
    pub rank: Option<usize>,
    /// Whether other ranks recorded a tensor of the same pass, layer and name: then each is
    /// its rank's shard (tensor parallelism), and a shard is compared only with the same
    /// rank's shard of the other trace (see [`TraceTensors::merge_ranks`]).
    pub shard: bool,
    /// The trace file it was read from: its captures are beside it.
    pub file: Option<Arc<Path>>,
}

/// The record a compared tensor came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A stage of a layer event (`input` and `output` included).
    Stage,
    /// The probabilities of an attention event.
    Attention,
    /// The logits of a logits event.
    Logits,
}

impl TracedTensor {
    /// Whether it is a stage of a layer (else attention probabilities or logits).
    pub fn is_stage(&self) -> bool {
        self.kind == TensorKind::Stage
    }

    /// `layer.{layer}.{name}`.
    pub fn full_name(&self) -> String {
        full_name(self.layer, &self.name)
    }

    /// The rank whose shard it is, if it is a shard.
    pub fn shard_of(&self) -> Option<usize> {
        if self.shard {
            self.rank
        } else {
            None
        }
    }

    /// What it is matched by in a comparison whose names are renamed by `names`: a name map
    /// renames stages; attention and logits records match as what they are.
    pub fn key(&self, names: &NameMap) -> TensorKey {
        let shard = self.shard_of();
        if self.is_stage() && !names.is_empty() {
            let renamed = names.rename(&self.full_name());
            if let Some((layer, name)) = split_full_name(&renamed) {
                return TensorKey {
                    pass: self.pass,
                    layer,
                    name: name.to_owned(),
                    shard,
                };
            }
        }
        TensorKey {
            pass: self.pass,
            layer: self.layer,
            name: self.name.clone(),
            shard,
        }
    }
}

/// Tensors of a trace, in execution order: a whole trace, or one pass of it (a long trace is
/// compared pass by pass: [`take`](Self::take) empties it to go on).
#[derive(Debug, Clone, Default)]
pub struct TraceTensors {
    /// The tensors.
    pub tensors: Vec<TracedTensor>,
    /// Relative precision of the statistics when they were rounded (a converted trace whose
    /// statistics were printed to a few digits); 0 for exact ones.
    pub stats_precision: f64,
    /// Stamped on the tensors pushed.
    rank: Option<usize>,
    file: Option<Arc<Path>>,
}

impl TraceTensors {
    /// Collects the tensors of a trace's events: layer stages (input and output included),
    /// attention probabilities and logits. `file` is where the trace was read from (for a
    /// loader of its captured tensors).
    pub fn from_events(
        header: &TraceHeader,
        file: Option<&Path>,
        events: impl IntoIterator<Item = Event>,
    ) -> Self {
        let mut tensors = Self::new(header, file);
        for event in events {
            tensors.push(event);
        }
        tensors.finish()
    }

    /// No tensors yet: [`push`](Self::push) the events of the trace `header` begins as they
    /// are read (keeping only what comparisons need of each), then [`finish`](Self::finish).
    pub fn new(header: &TraceHeader, file: Option<&Path>) -> Self {
        let stats_precision = header
            .metadata
            .extra
            .get("stats_precision")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0.0);
        Self {
            tensors: Vec::new(),
            stats_precision,
            rank: header.rank,
            file: file.map(Arc::from),
        }
    }

    /// Takes the tensors of one event; other events are ignored.
    pub fn push(&mut self, event: Event) {
        let (seq, pass, layer, name, kind, tensor) = match event {
            Event::Layer(layer) => {
                for stage in layer.stages {
                    self.tensors.push(TracedTensor {
                        seq: stage.seq,
                        pass: layer.pass,
                        layer: layer.layer,
                        name: stage.name.into_owned(),
                        kind: TensorKind::Stage,
                        tensor: stage.tensor,
                        rank: self.rank,
                        shard: false,
                        file: self.file.clone(),
                    });
                }
                return;
            }
            Event::Attention(a) => (
                a.seq,
                a.pass.unwrap_or(0),
                a.layer,
                "attention",
                TensorKind::Attention,
                a.probs,
            ),
            Event::Logits(l) => (
                l.seq,
                l.pass,
                l.layer,
                "logits",
                TensorKind::Logits,
                l.logits,
            ),
            _ => return,
        };
        self.tensors.push(TracedTensor {
            seq,
            pass,
            layer,
            name: name.to_owned(),
            kind,
            tensor,
            rank: self.rank,
            shard: false,
            file: self.file.clone(),
        });
    }

    /// Puts the tensors in execution order.
    #[must_use]
    pub fn finish(mut self) -> Self {
        self.tensors.sort_by_key(|t| (t.rank, t.seq));
        self
    }

    /// The tensors pushed so far, in execution order, leaving none: what a pass by pass reader
    /// hands on at the end of each pass.
    pub fn take(&mut self) -> Self {
        let mut tensors = std::mem::take(&mut self.tensors);
        if !tensors.is_sorted_by_key(|t| t.seq) {
            tensors.sort_unstable_by_key(|t| t.seq);
        }
        Self {
            tensors,
            stats_precision: self.stats_precision,
            rank: self.rank,
            file: self.file.clone(),
        }
    }

    /// The tensors of several ranks of one run as one trace, for the same pass (or passes) of
    /// each: rank by rank (a pipeline's ranks run its layers in rank order), each in execution
    /// order. Where several ranks recorded a tensor of the same pass, layer and name, each is
    /// marked a [`shard`](TracedTensor::shard) of its rank: tensor parallelism splits a
    /// tensor across the ranks, and a shard is compared with the same rank's shard only. (The
    /// whole tensor, when a rank records it after gathering the shards, is compared as a
    /// whole.) The statistics' precision is the coarsest of theirs.
    pub fn merge_ranks(parts: impl IntoIterator<Item = TraceTensors>) -> Self {
        let mut parts: Vec<TraceTensors> = parts.into_iter().collect();
        if parts.len() == 1 {
            return parts.remove(0);
        }
        let mut merged = Self::default();
        for part in parts {
            merged.stats_precision = merged.stats_precision.max(part.stats_precision);
            merged.tensors.extend(part.tensors);
        }
        merged
            .tensors
            .sort_unstable_by_key(|t| (t.pass, t.rank, t.seq));
        let mut ranks: HashMap<(usize, usize, &str), Option<usize>> = HashMap::new();
        let mut sharded = std::collections::HashSet::new();
        for t in &merged.tensors {
            let key = (t.pass, t.layer, t.name.as_str());
            match ranks.get(&key) {
                Some(&rank) if rank != t.rank => {
                    sharded.insert((t.pass, t.layer, t.name.clone()));
                }
                Some(_) => {}
                None => {
                    ranks.insert(key, t.rank);
                }
            }
        }
        if !sharded.is_empty() {
            for t in &mut merged.tensors {
                t.shard = sharded.contains(&(t.pass, t.layer, t.name.clone()));
            }
        }
        merged
    }
}

/// What a comparison of one pair found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Equal fingerprints: the same bits.
    BitIdentical,
    /// Within tolerance.
    Close,
    /// Not within tolerance.
    Diverged,
    /// Different shapes (dimensions of size 1 aside).
    ShapeMismatch,
}

impl Verdict {
    /// Diverged or a shape mismatch.
    pub fn is_divergence(self) -> bool {
        matches!(self, Self::Diverged | Self::ShapeMismatch)
    }
}

/// One quantity checked against its allowance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was compared: `mean`, `sketch[3]`, `head[0]`, `nan_count`, `elements`, ...
    pub what: String,
    /// The reference's value.
    pub reference: f64,
    /// The other trace's value.
    pub other: f64,
    /// `|other − reference|` (for `elements`: the decisive statistic of the `r_i`).
    pub difference: f64,
    /// How much the tolerance allows.
    pub allowed: f64,
}

impl Check {
    /// `difference / allowed`: above 1, out of tolerance.
    pub fn ratio(&self) -> f64 {
        if self.difference == 0.0 {
            0.0
        } else if self.allowed > 0.0 {
            self.difference / self.allowed
        } else {
            f64::INFINITY
        }
    }
}

/// How far apart two tensors are, measured exactly from captures or estimated from sketches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorMeasure {
    /// `‖b − a‖₂ / ‖a‖₂`: exact from captures; from sketches an estimate,
    /// `‖Δsketch‖₂ / (√8·‖a‖₂)`, whose expectation is the exact value (each ±1 projection
    /// preserves the squared norm in expectation; with 8 of them it is within a factor of 2
    /// most of the time).
    pub relative_error: Option<f64>,
    /// Whether `relative_error` and the others are exact (from captures).
    pub exact: bool,
    /// Largest `|b_i − a_i|` (captures only).
    pub max_abs_error: Option<f64>,
    /// Largest `|b_i − a_i| / |a_i|` over `a_i ≠ 0` (captures only).
    pub max_rel_error: Option<f64>,
    /// Cosine similarity (captures only).
    pub cosine: Option<f64>,
    /// `10·log10(mean((b − a)²) / var(a))`, as llama.cpp's conversion checks measure it
    /// (captures only; −∞ when equal).
    pub nmse_db: Option<f64>,
    /// Elements out of tolerance, of all (captures only).
    pub mismatched: Option<(usize, usize)>,
}

/// One matched pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorComparison {
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The name (after renaming).
    pub name: String,
    /// The rank whose shard both tensors are (see [`TracedTensor::shard`]); `None` for whole
    /// tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
    /// The reference's sequence number.
    pub seq: u64,
    /// Shapes: reference, other.
    pub shapes: (Vec<usize>, Vec<usize>),
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// The error statistic applied (for captured tensors; summaries are checked against the
    /// bounds it implies).
    #[serde(default)]
    pub error_stat: ErrorStat,
    /// What decided: `elementwise` (captures) or `summary`.
    pub method: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Every check made, the failing ones first.
    pub checks: Vec<Check>,
    /// How far apart.
    pub error: ErrorMeasure,
    /// The smallest `rtol` under which the pair is close, with the same `atol` and error
    /// statistic: 0 when `atol` alone is enough; `None` (JSON `null`) when no `rtol` is (a NaN
    /// count that differs, a value beyond a zero of the reference under `elementwise`, another
    /// shape). Compared by captures it is exact; by summaries it is the smallest `rtol` at
    /// which every summary is within its bound (those of `elementwise`, or of `norm` under
    /// `norm`), a lower bound on what the captures would give under `elementwise` and `norm`.
    #[serde(default)]
    pub least_rtol: Option<f64>,
}

impl TensorComparison {
    /// The largest `difference / allowed` of the checks.
    pub fn worst_ratio(&self) -> f64 {
        self.checks.iter().map(Check::ratio).fold(0.0, f64::max)
    }

    /// How far out of tolerance the pair is: its [`worst_ratio`](Self::worst_ratio), infinite
    /// for a shape mismatch (no check measures one).
    pub fn ratio(&self) -> f64 {
        match self.verdict {
            Verdict::ShapeMismatch => f64::INFINITY,
            _ => self.worst_ratio(),
        }
    }
}

/// Which tensor of a trace: what two traces' tensors are matched by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorKey {
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The name (after renaming).
    pub name: String,
    /// The rank whose shard it is; `None` for a whole tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

/// A tensor present in one trace only.
pub type Unmatched = TensorKey;

impl TensorKey {
    /// `pass 3 layer.7.mlp_out`, with `(rank 1's shard)` for a shard.
    pub fn describe(&self) -> String {
        let shard = self
            .shard
            .map_or_else(String::new, |rank| format!(" (rank {rank}'s shard)"));
        format!(
            "pass {} layer.{}.{}{shard}",
            self.pass, self.layer, self.name
        )
    }
}

/// How to compare.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Tolerances.
    pub tolerances: Tolerances,
    /// Renames applied to both traces' names.
    pub names: NameMap,
    /// Compare captured tensors elementwise when both sides have them (the default); `false`
    /// compares summaries only.
    pub use_captures: bool,
}

/// The result of comparing a trace with a reference.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Comparison {
    /// Every matched pair, in the reference's execution order.
    pub pairs: Vec<TensorComparison>,
    /// In the reference only.
    pub missing: Vec<Unmatched>,
    /// In the other trace only.
    pub extra: Vec<Unmatched>,
    /// Problems reading captures (the pair then was compared by its summaries).
    pub warnings: Vec<String>,
    /// Per-name overrides of the tolerances that matched no tensor of either trace.
    #[serde(default)]
    pub unused_overrides: Vec<UnusedOverride>,
}

impl Comparison {
    /// The first pair that diverged, in the reference's execution order.
    pub fn first_divergence(&self) -> Option<&TensorComparison> {
        self.pairs.iter().find(|p| p.verdict.is_divergence())
    }

    /// How many pairs have each verdict.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.pairs.iter().filter(|p| p.verdict == verdict).count()
    }
}

/// Compares `other` with `reference`.
///
/// `captures` gives the values of a tensor of a trace that was captured in full (`None` when it
/// was not; an error when it cannot be read, which becomes a warning and a comparison by
/// summaries). It is asked only when [`CompareOptions::use_captures`] is set and the pair is
/// not bit-identical, for the reference's tensor first and the other's only when the
/// reference's was captured. A loader of trace files on disk reads
/// [`TracedTensor::tensor`]'s `capture` beside [`TracedTensor::file`] with
/// [`read_capture`](crate::read_capture); `|_, _| None::<Result<_, String>>` compares
/// summaries only.
///
/// The traces may be whole or one pass each: a long run is compared pass by pass, each pass's
/// result folded into what the caller keeps (`model-trace diff` does so).
pub fn compare<E: fmt::Display>(
    reference: &TraceTensors,
    other: &TraceTensors,
    options: &CompareOptions,
    captures: impl FnMut(&TraceTensors, &TracedTensor) -> Option<Result<Vec<f32>, E>>,
) -> Comparison {
    compare_with_least_rtol(reference, other, options, captures, |_| None)
}

/// Compares like [`compare`], each pair's `rtol` raised to what `least_rtol` gives for its
/// tensor where that is more than the tolerances' own: a tolerance set tensor by tensor, as
/// `model-trace diff --floor` allows a port a multiple of a second implementation's error
/// ([`TensorComparison::least_rtol`] of that implementation's comparison).
pub fn compare_with_least_rtol<E: fmt::Display>(
    reference: &TraceTensors,
    other: &TraceTensors,
    options: &CompareOptions,
    mut captures: impl FnMut(&TraceTensors, &TracedTensor) -> Option<Result<Vec<f32>, E>>,
    least_rtol: impl Fn(&TensorKey) -> Option<f64>,
) -> Comparison {
    let key = |t: &TracedTensor| t.key(&options.names);
    let mut others: HashMap<TensorKey, &TracedTensor> = HashMap::with_capacity(other.tensors.len());
    for tensor in &other.tensors {
        others.entry(key(tensor)).or_insert(tensor);
    }
    let mut comparison = Comparison::default();
    let mut seen = std::collections::HashSet::with_capacity(reference.tensors.len());
    for tensor in &reference.tensors {
        let k = key(tensor);
        if !seen.insert(k.clone()) {
            continue;
        }
        let Some(matched) = others.get(&k) else {
            comparison.missing.push(k);
            continue;
        };
        let name = full_name(k.layer, &k.name);
        let mut tolerance = options.tolerances.for_name(&name);
        if let Some(rtol) = least_rtol(&k) {
            tolerance.rtol = tolerance.rtol.max(rtol);
        }
        let pair = Pair {
            reference: (reference, tensor),
            other: (other, matched),
            tolerance,
            error_stat: options.tolerances.error_stat_for(&name),
        };
        let loader = options.use_captures.then_some(&mut captures);
        let compared = pair.compare(loader, &mut comparison.warnings);
        comparison.pairs.push(TensorComparison {
            pass: k.pass,
            layer: k.layer,
            name: k.name,
            shard: k.shard,
            ..compared
        });
    }
    let matched: std::collections::HashSet<_> = seen;
    for tensor in &other.tensors {
        let k = key(tensor);
        if !matched.contains(&k) {
            comparison.extra.push(k);
        }
    }
    comparison.extra.dedup();
    let names = (reference.tensors.iter()).chain(&other.tensors).map(|t| {
        let k = key(t);
        full_name(k.layer, &k.name)
    });
    comparison.unused_overrides = options.tolerances.unused_overrides(names);
    comparison
}

/// A matched pair and how to judge it.
struct Pair<'a> {
    reference: (&'a TraceTensors, &'a TracedTensor),
    other: (&'a TraceTensors, &'a TracedTensor),
    tolerance: Tolerance,
    error_stat: ErrorStat,
}

impl Pair<'_> {
    /// The verdict: from the values when `captures` (if given) has both, else from the
    /// summaries.
    fn compare<E: fmt::Display>(
        &self,
        captures: Option<
            &mut impl FnMut(&TraceTensors, &TracedTensor) -> Option<Result<Vec<f32>, E>>,
        >,
        warnings: &mut Vec<String>,
    ) -> TensorComparison {
        let (a, b) = (&self.reference.1.tensor, &self.other.1.tensor);
        let mut result = TensorComparison {
            pass: 0,
            layer: 0,
            name: String::new(),
            shard: None,
            seq: self.reference.1.seq,
            shapes: (a.shape.clone(), b.shape.clone()),
            tolerance: self.tolerance,
            error_stat: self.error_stat,
            method: "summary".to_owned(),
            verdict: Verdict::Close,
            checks: Vec::new(),
            error: ErrorMeasure::default(),
            least_rtol: None,
        };
        if squeezed(&a.shape) != squeezed(&b.shape) {
            result.verdict = Verdict::ShapeMismatch;
            return result;
        }
        let same_bits = match (&a.fingerprint, &b.fingerprint) {
            (Some(x), Some(y)) => x.same_bits(y),
            _ => false,
        };
        if same_bits {
            result.verdict = Verdict::BitIdentical;
            result.error = ErrorMeasure {
                relative_error: Some(0.0),
                exact: true,
                ..ErrorMeasure::default()
            };
            result.least_rtol = Some(0.0);
            return result;
        }
        let values = captures.and_then(|load| self.captured(load, warnings));
        if let Some((ref_values, other_values)) = values {
            if let Some((check, error)) =
                elementwise::compare(&ref_values, &other_values, self, warnings)
            {
                result.method = "elementwise".to_owned();
                result.verdict = if check.ratio() <= 1.0 {
                    Verdict::Close
                } else {
                    Verdict::Diverged
                };
                result.checks = vec![check];
                result.error = error;
                result.least_rtol = elementwise::least_rtol(
                    &ref_values,
                    &other_values,
                    self.tolerance.atol,
                    self.error_stat,
                );
                return result;
            }
        }
        let precision = self
            .reference
            .0
            .stats_precision
            .max(self.other.0.stats_precision);
        result.checks = bounds::checks(a, b, self.tolerance, self.error_stat, precision);
        result
            .checks
            .sort_by(|x, y| y.ratio().total_cmp(&x.ratio()));
        result.verdict = if result.worst_ratio() <= 1.0 {
            Verdict::Close
        } else {
            Verdict::Diverged
        };
        result.error = bounds::estimate(a, b);
        result.least_rtol =
            bounds::least_rtol(a, b, self.tolerance.atol, self.error_stat, precision);
        result
    }

    /// Both sides' captured values, or `None` when either side was not captured (or a capture
    /// could not be read: then a warning says why).
    fn captured<E: fmt::Display>(
        &self,
        load: &mut impl FnMut(&TraceTensors, &TracedTensor) -> Option<Result<Vec<f32>, E>>,
        warnings: &mut Vec<String>,
    ) -> Option<(Vec<f32>, Vec<f32>)> {
        let a = load(self.reference.0, self.reference.1)?;
        let b = load(self.other.0, self.other.1)?;
        match (a, b) {
            (Ok(a), Ok(b)) => Some((a, b)),
            (Err(e), _) | (_, Err(e)) => {
                warnings.push(format!("{e}; compared by summaries instead"));
                None
            }
        }
    }
}

/// The smallest `rtol` at which `difference` is within `fixed + rtol·scale` (an allowance that
/// grows with `rtol`, as every bound of a comparison does): 0 when `fixed` is enough, `None`
/// when no `rtol` is (a non-finite difference, or none allowed however large `rtol` is).
/// Rounded up by a few units in the last place, so that the check passes at it.
fn rtol_needed(difference: f64, fixed: f64, scale: f64) -> Option<f64> {
    if difference <= fixed {
        Some(0.0)
    } else if difference.is_finite() && scale > 0.0 {
        Some((difference - fixed) / scale * (1.0 + 4.0 * f64::EPSILON))
    } else {
        None
    }
}

/// The shape without its dimensions of size 1 (`[1, 7, 384]` and `[7, 384]` hold the same
/// values in the same order).
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}
