//! The error split (`diff REF PORT --quantized PORT_Q`): REF the reference, PORT the port on
//! the weights the reference uses (dequantized), PORT_Q the same port on its quantized weights.
//! For each tensor (pass, layer, stage) in all three, three differences: the total `PORT_Q −
//! REF`, the quantization's part `PORT_Q − PORT` and the logic's part `PORT − REF`. As vectors
//! the total is the sum of the two parts exactly, so their norms (each over `‖REF‖`) say which
//! part dominates a layer, and a logic part above float rounding is a bug the quantization
//! hides. From captured values where all three captured the tensor (exact); else from the
//! three sketches (estimated, `≈`).
//!
//! `parts` is the arithmetic of one tensor, this file the fold pass by pass and the rows
//! reported per layer, `text` how they read.

mod parts;
mod text;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use trace_runtime::compare::{CompareOptions, TensorKey, TraceTensors, TracedTensor};
use trace_runtime::{CaptureError, QuantizationErrorTrace};

use self::parts::Parts;
use super::diff_report::FileInfo;
use crate::precision::{Weights, WeightsSaid};

/// The split, folded pass by pass.
#[derive(Debug)]
pub(super) struct Splitter {
    /// Where the quantized run is among the runs read.
    pub(super) at: usize,
    pub(super) tally: SplitTally,
}

/// One tensor's error split, each part `‖·‖ / ‖REF‖`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SplitTensor {
    pub(crate) pass: usize,
    pub(crate) layer: usize,
    pub(crate) stage: String,
    /// The rank whose shard it is; absent for a whole tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shard: Option<usize>,
    /// `‖PORT_Q − REF‖ / ‖REF‖`; `null` where the reference is all zeros.
    pub(crate) total: Option<f64>,
    /// `‖PORT_Q − PORT‖ / ‖REF‖`.
    pub(crate) quantization: Option<f64>,
    /// `‖PORT − REF‖ / ‖REF‖`.
    pub(crate) logic: Option<f64>,
    /// From the values (all three captured); else estimated from the sketches.
    pub(crate) exact: bool,
    /// The largest `|quantization + logic − total|` of an element (of a sketch component
    /// where estimated), absolute: zero but for rounding.
    pub(crate) identity_residual: f64,
}

/// The split of one pass: its tensors, and per layer what the quantized run's quantization
/// records say.
#[derive(Debug, Clone, Default)]
pub(crate) struct PassSplit {
    pub(crate) tensors: Vec<SplitTensor>,
    pub(crate) quant: BTreeMap<usize, QuantRecords>,
    /// Not split: the port or the quantized run consumed other token ids than the reference.
    pub(crate) other_tokens: bool,
}

/// A layer's quantization records (`quant` events of the quantized run): each quantized
/// matmul's output against its own f32 matmul.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct QuantRecords {
    /// The largest `‖q − r‖ / ‖r‖` of the layer's records (from their SNR).
    pub(crate) worst_relative_error: f64,
    pub(crate) records: usize,
}

/// What the split found over the whole run.
#[derive(Debug, Default, Serialize)]
pub(crate) struct SplitTally {
    /// Tensors split (in all three runs).
    pub(crate) split: usize,
    /// Of those, split from captured values.
    pub(crate) exact: usize,
    /// Of those, estimated from the sketches.
    pub(crate) estimated: usize,
    /// Tensors in all three runs that could not be split: shapes that differ (dimensions of
    /// size 1 aside, as the comparison matches them), or neither all three captures nor all
    /// three sketches.
    pub(crate) not_split: usize,
    /// Of those, the tensors whose shapes differ.
    pub(crate) shapes_differ: usize,
    /// Passes not split because the port or the quantized run consumed other token ids than
    /// the reference (as their `pass_begin` events say).
    pub(crate) passes_other_tokens: usize,
    /// The first of those passes.
    pub(crate) first_pass_other_tokens: Option<usize>,
    /// Tensors of the reference and the port that the quantized run lacks.
    pub(crate) not_in_quantized: usize,
    /// The largest identity residual over the run (see [`SplitTensor::identity_residual`]).
    pub(crate) identity_residual: f64,
    /// Elements left out because a value of one of the runs is NaN or infinite.
    pub(crate) non_finite_elements: usize,
}

/// Which part of a layer's error is the larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Dominant {
    Quantization,
    Logic,
    /// Equal (both zero, say), or unknown.
    Neither,
}

/// One layer's row: its stage with the largest total and that stage's parts, its stage with
/// the largest logic part and that part, its largest quantization part, the larger of its
/// largest parts, and its quantization records.
#[derive(Debug, Serialize)]
pub(crate) struct LayerSplit<'a> {
    pub(crate) layer: usize,
    /// The stage with the largest total.
    pub(crate) stage: &'a str,
    pub(crate) total: Option<f64>,
    pub(crate) quantization: Option<f64>,
    pub(crate) logic: Option<f64>,
    /// The stage with the largest logic part (a bug the quantization hides in `stage`).
    pub(crate) worst_logic_stage: &'a str,
    pub(crate) worst_logic: Option<f64>,
    /// The stage with the largest quantization part.
    pub(crate) worst_quantization_stage: &'a str,
    pub(crate) worst_quantization: Option<f64>,
    /// Whether every split tensor of the layer is exact.
    pub(crate) exact: bool,
    /// `worst_quantization` against `worst_logic`.
    pub(crate) dominant: Dominant,
    /// `null` where the quantized run recorded none for the layer in this pass.
    pub(crate) quant_records: Option<QuantRecords>,
}

/// What `diff --json` writes of the split (`split`).
#[derive(Debug, Serialize)]
pub(crate) struct SplitReport<'a> {
    /// The quantized run.
    pub(crate) quantized: &'a FileInfo,
    /// The pass of the per-layer rows (the comparison's table pass).
    pub(crate) table_pass: usize,
    pub(crate) layers: Vec<LayerSplit<'a>>,
    /// Whether that pass was not split, consuming other token ids in the port or the quantized
    /// run than in the reference (counted in `passes_other_tokens`).
    #[serde(skip)]
    pub(crate) table_pass_other_tokens: bool,
    /// Every tensor of that pass split.
    pub(crate) tensors: &'a [SplitTensor],
    #[serde(flatten)]
    pub(crate) tally: &'a SplitTally,
    /// What the headers say against the split's premise (the quantized run not quantized,
    /// the port quantized).
    pub(crate) warnings: &'a [String],
}

impl Splitter {
    /// A split whose quantized run is the `at`-th of the runs read.
    pub(super) fn new(at: usize) -> Self {
        Self {
            at,
            tally: SplitTally::default(),
        }
    }

    /// Splits the tensors of one pass in all three runs (`quantized`: the quantized run's
    /// tensors and quantization records of the pass, if it has the pass), `load` giving a
    /// captured tensor's values; a capture that cannot be read is a warning in `warnings`
    /// and the tensor is estimated from its sketches. A tensor whose shapes differ is not
    /// split.
    pub(super) fn pass(
        &mut self,
        [reference, port]: [&TraceTensors; 2],
        quantized: Option<(&TraceTensors, &[QuantizationErrorTrace])>,
        options: &CompareOptions,
        load: &mut impl FnMut(&TracedTensor) -> Option<Result<Vec<f32>, CaptureError>>,
        warnings: &mut Vec<String>,
    ) -> PassSplit {
        let empty = TraceTensors::default();
        let (quantized, records) = quantized.unwrap_or((&empty, &[]));
        let (port, quantized) = (by_key(port, options), by_key(quantized, options));
        let mut seen = HashSet::new();
        let mut split = PassSplit {
            tensors: Vec::new(),
            quant: quant_records(records),
            other_tokens: false,
        };
        for r in &reference.tensors {
            let key = r.key(&options.names);
            let Some(p) = port.get(&key).filter(|_| seen.insert(key.clone())) else {
                continue;
            };
            let Some(q) = quantized.get(&key) else {
                self.tally.not_in_quantized += 1;
                continue;
            };
            let shape = squeezed(&r.tensor.shape);
            if [p, q].iter().any(|t| squeezed(&t.tensor.shape) != shape) {
                self.tally.not_split += 1;
                self.tally.shapes_differ += 1;
                continue;
            }
            let loaded = options
                .use_captures
                .then(|| values([r, p, q], load, warnings));
            match split_tensor([r, p, q], loaded.flatten()) {
                Some((parts, exact)) => split.tensors.push(self.fold(key, &parts, exact)),
                None => self.tally.not_split += 1,
            }
        }
        split
    }

    /// Counts in a pass not split because the port or the quantized run consumed other token
    /// ids than the reference; its (empty) split.
    pub(super) fn other_tokens(&mut self, pass: usize) -> PassSplit {
        self.tally.passes_other_tokens += 1;
        self.tally.first_pass_other_tokens.get_or_insert(pass);
        PassSplit {
            other_tokens: true,
            ..PassSplit::default()
        }
    }

    /// Counts one tensor's split in, and its row.
    fn fold(&mut self, key: TensorKey, parts: &Parts, exact: bool) -> SplitTensor {
        let tally = &mut self.tally;
        tally.split += 1;
        *if exact {
            &mut tally.exact
        } else {
            &mut tally.estimated
        } += 1;
        tally.identity_residual = tally.identity_residual.max(parts.residual);
        tally.non_finite_elements += parts.non_finite;
        SplitTensor {
            pass: key.pass,
            layer: key.layer,
            stage: key.name,
            shard: key.shard,
            total: parts.relative(parts.total),
            quantization: parts.relative(parts.quantization),
            logic: parts.relative(parts.logic),
            exact,
            identity_residual: parts.residual,
        }
    }
}

/// What the headers of the port (`port`) and of the quantized run (`quantized`, at
/// `quantized_path`) say against the split's premise: the quantized run on quantized weights,
/// the port on float weights.
pub(super) fn premise_warnings(
    port: (&WeightsSaid, &str),
    quantized: (&WeightsSaid, &str),
) -> Vec<String> {
    let mut warnings = Vec::new();
    let (said, path) = quantized;
    if !said.is_quantized() {
        let says = match &said.weights {
            Weights::Unknown => "does not say its weights are quantized".to_owned(),
            _ => format!("says its weights are not quantized ({})", said.describe()),
        };
        warnings.push(format!(
            "the quantized run {path}: its header {says}: the split's quantization part is \
             the quantized run against the other only if it ran on quantized weights"
        ));
    }
    let (said, path) = port;
    let says = match &said.weights {
        Weights::Float(_) => return warnings,
        Weights::Quantized => format!("says its weights are quantized ({})", said.describe()),
        Weights::Unknown | Weights::Other => "does not say it ran on float weights".to_owned(),
    };
    warnings.push(format!(
        "the other {path}: its header {says}: the split's logic part is the other against the \
         reference only on the weights the reference uses (dequantized: candle's \
         CANDLE_DEQUANTIZE_ALL=1, the examples' --dequantize)"
    ));
    warnings
}

/// The tensors of `tensors` by what they are matched by (the first of a key).
fn by_key<'a>(
    tensors: &'a TraceTensors,
    options: &CompareOptions,
) -> HashMap<TensorKey, &'a TracedTensor> {
    let mut keyed = HashMap::with_capacity(tensors.tensors.len());
    for tensor in &tensors.tensors {
        keyed.entry(tensor.key(&options.names)).or_insert(tensor);
    }
    keyed
}

/// The three runs' captured values of one tensor, when all three captured it and could be
/// read (a capture that cannot be read is a warning).
fn values(
    tensors: [&TracedTensor; 3],
    load: &mut impl FnMut(&TracedTensor) -> Option<Result<Vec<f32>, CaptureError>>,
    warnings: &mut Vec<String>,
) -> Option<[Vec<f32>; 3]> {
    if tensors.iter().any(|t| t.tensor.capture.is_none()) {
        return None;
    }
    let mut values = Vec::with_capacity(3);
    for tensor in tensors {
        match load(tensor)? {
            Ok(read) => values.push(read),
            Err(e) => {
                warnings.push(format!(
                    "the split: {e}; layer.{}.{} estimated from the sketches instead",
                    tensor.layer, tensor.name
                ));
                return None;
            }
        }
    }
    values.try_into().ok()
}

/// The shape without its dimensions of size 1 (`[1, 7, 384]` and `[7, 384]` hold the same
/// values), as the comparison matches shapes.
fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// One tensor's parts (its shapes the same in the three runs), and whether they are exact:
/// from `values` where given and of one length, else from the sketches; `None` where neither
/// can split it.
fn split_tensor(
    tensors: [&TracedTensor; 3],
    values: Option<[Vec<f32>; 3]>,
) -> Option<(Parts, bool)> {
    if let Some([r, p, q]) = &values {
        if r.len() == p.len() && p.len() == q.len() {
            return Some((Parts::from_values(r, p, q), true));
        }
        return None;
    }
    let [r, p, q] = tensors.map(|t| &t.tensor);
    if r.numel() != p.numel() || p.numel() != q.numel() {
        return None;
    }
    let (rs, ps, qs) = (r.sketch.as_ref()?, p.sketch.as_ref()?, q.sketch.as_ref()?);
    let parts = Parts::from_sketches(rs, ps, qs, f64::from(r.stats.l2_norm));
    Some((parts, false))
}

/// Per layer, the worst relative error of the quantization records and how many there are.
fn quant_records(records: &[QuantizationErrorTrace]) -> BTreeMap<usize, QuantRecords> {
    let mut layers: BTreeMap<usize, QuantRecords> = BTreeMap::new();
    for record in records {
        // SNR = 10·log10(Σr² / Σ(q−r)²), so ‖q − r‖ / ‖r‖ = 10^(−SNR/20).
        let relative = 10f64.powf(-f64::from(record.snr_db) / 20.0);
        let layer = layers.entry(record.layer_idx).or_insert(QuantRecords {
            worst_relative_error: 0.0,
            records: 0,
        });
        layer.worst_relative_error = layer.worst_relative_error.max(relative);
        layer.records += 1;
    }
    layers
}

impl PassSplit {
    /// Per layer, its stage with the largest total (the first of equals) and that stage's
    /// parts, its stage with the largest logic part, its largest quantization part, and its
    /// quantization records.
    pub(crate) fn layers(&self) -> Vec<LayerSplit<'_>> {
        // Per layer: the worst tensor by total, by logic, by quantization, and whether all exact.
        type Worst<'t> = [&'t SplitTensor; 3];
        let mut worst: BTreeMap<usize, (Worst<'_>, bool)> = BTreeMap::new();
        let parts = [
            |t: &SplitTensor| t.total,
            |t: &SplitTensor| t.logic,
            |t: &SplitTensor| t.quantization,
        ];
        for tensor in &self.tensors {
            let (row, exact) = worst.entry(tensor.layer).or_insert(([tensor; 3], true));
            *exact &= tensor.exact;
            for (at, part) in parts.iter().enumerate() {
                if part(tensor).unwrap_or(-1.0) > part(row[at]).unwrap_or(-1.0) {
                    row[at] = tensor;
                }
            }
        }
        (worst.into_iter())
            .map(|(layer, ([t, l, q], exact))| LayerSplit {
                layer,
                stage: &t.stage,
                total: t.total,
                quantization: t.quantization,
                logic: t.logic,
                worst_logic_stage: &l.stage,
                worst_logic: l.logic,
                worst_quantization_stage: &q.stage,
                worst_quantization: q.quantization,
                exact,
                dominant: dominant(q.quantization, l.logic),
                quant_records: self.quant.get(&layer).copied(),
            })
            .collect()
    }
}

/// The larger of the two parts.
fn dominant(quantization: Option<f64>, logic: Option<f64>) -> Dominant {
    match (quantization, logic) {
        (Some(q), Some(l)) if q > l => Dominant::Quantization,
        (Some(q), Some(l)) if l > q => Dominant::Logic,
        _ => Dominant::Neither,
    }
}
