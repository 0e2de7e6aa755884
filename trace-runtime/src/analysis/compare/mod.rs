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
mod elementwise;
mod names;
mod tolerance;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

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
    /// Its sequence number: the order the trace computed it in.
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
}

/// Every tensor of one trace, in execution order, with what is needed to read its captures.
#[derive(Debug, Clone)]
pub struct TraceTensors {
    /// The trace's header.
    pub header: TraceHeader,
    /// The trace file, for a loader of its captured tensors
    /// ([`read_capture`](crate::read_capture) takes it).
    pub path: Option<PathBuf>,
    /// The tensors, by sequence number.
    pub tensors: Vec<TracedTensor>,
    /// Relative precision of the statistics when they were rounded (a converted trace whose
    /// statistics were printed to a few digits); 0 for exact ones.
    pub stats_precision: f64,
}

impl TraceTensors {
    /// Collects the tensors of a trace's events: layer stages (input and output included),
    /// attention probabilities and logits.
    pub fn from_events(
        header: TraceHeader,
        path: Option<&Path>,
        events: impl IntoIterator<Item = Event>,
    ) -> Self {
        let mut tensors = Self::new(header, path);
        for event in events {
            tensors.push(event);
        }
        tensors.finish()
    }

    /// No tensors yet: [`push`](Self::push) the events as they are read (keeping only what
    /// comparisons need of each), then [`finish`](Self::finish).
    pub fn new(header: TraceHeader, path: Option<&Path>) -> Self {
        let stats_precision = header
            .metadata
            .extra
            .get("stats_precision")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0.0);
        Self {
            header,
            path: path.map(Path::to_path_buf),
            tensors: Vec::new(),
            stats_precision,
        }
    }

    /// Takes the tensors of one event; other events are ignored.
    pub fn push(&mut self, event: Event) {
        match event {
            Event::Layer(layer) => {
                for stage in layer.stages {
                    self.tensors.push(TracedTensor {
                        seq: stage.seq,
                        pass: layer.pass,
                        layer: layer.layer,
                        name: stage.name.into_owned(),
                        kind: TensorKind::Stage,
                        tensor: stage.tensor,
                    });
                }
            }
            Event::Attention(attention) => self.tensors.push(TracedTensor {
                seq: attention.seq,
                pass: attention.pass.unwrap_or(0),
                layer: attention.layer,
                name: "attention".to_owned(),
                kind: TensorKind::Attention,
                tensor: attention.probs,
            }),
            Event::Logits(logits) => self.tensors.push(TracedTensor {
                seq: logits.seq,
                pass: logits.pass,
                layer: logits.layer,
                name: "logits".to_owned(),
                kind: TensorKind::Logits,
                tensor: logits.logits,
            }),
            _ => {}
        }
    }

    /// Puts the tensors in execution order.
    #[must_use]
    pub fn finish(mut self) -> Self {
        self.tensors.sort_by_key(|t| t.seq);
        self
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
}

impl TensorComparison {
    /// The largest `difference / allowed` of the checks.
    pub fn worst_ratio(&self) -> f64 {
        self.checks.iter().map(Check::ratio).fold(0.0, f64::max)
    }
}

/// A tensor present in one trace only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unmatched {
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The name (after renaming).
    pub name: String,
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
/// [`TracedTensor::tensor`]'s `capture` beside [`TraceTensors::path`] with
/// [`read_capture`](crate::read_capture); `|_, _| None::<Result<_, String>>` compares
/// summaries only.
pub fn compare<E: fmt::Display>(
    reference: &TraceTensors,
    other: &TraceTensors,
    options: &CompareOptions,
    mut captures: impl FnMut(&TraceTensors, &TracedTensor) -> Option<Result<Vec<f32>, E>>,
) -> Comparison {
    // Names maps rename stages; attention and logits records match as what they are.
    let key = |t: &TracedTensor| {
        if t.is_stage() {
            let renamed = options.names.rename(&t.full_name());
            if let Some((layer, name)) = split_full_name(&renamed) {
                return (t.pass, layer, name.to_owned());
            }
        }
        (t.pass, t.layer, t.name.clone())
    };
    let mut others: HashMap<(usize, usize, String), &TracedTensor> =
        HashMap::with_capacity(other.tensors.len());
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
            comparison.missing.push(Unmatched {
                pass: k.0,
                layer: k.1,
                name: k.2,
            });
            continue;
        };
        let name = full_name(k.1, &k.2);
        let pair = Pair {
            reference: (reference, tensor),
            other: (other, matched),
            tolerance: options.tolerances.for_name(&name),
            error_stat: options.tolerances.error_stat_for(&name),
        };
        let loader = options.use_captures.then_some(&mut captures);
        let compared = pair.compare(loader, &mut comparison.warnings);
        comparison.pairs.push(TensorComparison {
            pass: k.0,
            layer: k.1,
            name: k.2,
            ..compared
        });
    }
    let matched: std::collections::HashSet<_> = seen;
    for tensor in &other.tensors {
        let k = key(tensor);
        if !matched.contains(&k) {
            comparison.extra.push(Unmatched {
                pass: k.0,
                layer: k.1,
                name: k.2,
            });
        }
    }
    comparison.extra.dedup();
    let names = (reference.tensors.iter()).chain(&other.tensors).map(|t| {
        let (_, layer, name) = key(t);
        full_name(layer, &name)
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
            seq: self.reference.1.seq,
            shapes: (a.shape.clone(), b.shape.clone()),
            tolerance: self.tolerance,
            error_stat: self.error_stat,
            method: "summary".to_owned(),
            verdict: Verdict::Close,
            checks: Vec::new(),
            error: ErrorMeasure::default(),
        };
        if squeezed(&a.shape) != squeezed(&b.shape) {
            result.verdict = Verdict::ShapeMismatch;
            return result;
        }
        if a.fingerprint.is_some() && a.fingerprint == b.fingerprint {
            result.verdict = Verdict::BitIdentical;
            result.error = ErrorMeasure {
                relative_error: Some(0.0),
                exact: true,
                ..ErrorMeasure::default()
            };
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

/// The shape without its dimensions of size 1 (`[1, 7, 384]` and `[7, 384]` hold the same
/// values in the same order).
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}
