//! Per-layer activation statistics and the anomaly rules run over one forward pass.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::LayerEvent;
use crate::stats::TensorStats;

/// A layer whose residual ratio exceeds this barely changed its input: the skip connection
/// carries (almost) everything and the block's own computation is effectively switched off.
pub const RESIDUAL_DOMINANCE_THRESHOLD: f32 = 0.99;

/// Layers with an index below this are exempt from the vanishing rule. The first blocks read
/// embeddings, which in many models have a tiny spread (scaled or partly zero-initialised
/// positions), so a small `std` there is not yet a sign of signal collapse.
pub const VANISHING_WARMUP_LAYERS: usize = 2;

/// Statistics of one transformer block in one forward pass.
///
/// `input` and `output` are the residual stream entering and leaving the block; everything
/// recorded in between (see [`Stage`](crate::Stage) for the names with a fixed meaning, and any
/// name of the user's) is kept in `stages`, in execution order. A stage that was never recorded
/// is absent; `input_stats`/`output_stats` hold `TensorStats::default()` (`count == 0`) when
/// they were not recorded, which the anomaly rules ignore.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerActivationTrace {
    /// Index of the block in the model.
    pub layer_idx: usize,
    /// The block's input (the residual stream entering it).
    pub input_stats: TensorStats,
    /// The block's output (the residual stream leaving it).
    pub output_stats: TensorStats,
    /// The stages between input and output, by name, in execution order.
    pub stages: Vec<(String, TensorStats)>,
    /// How much of the output is the unchanged input, in `[0, 1]`; see
    /// [`LayerActivationTrace::residual_ratio_of`] for the definition and
    /// [`LayerActivationTrace::residual_ratio_from`] for the statistics-only bound. `0.0` when
    /// not computed.
    pub residual_ratio: f32,
    /// Whether `residual_ratio` is the exact value ([`record_residual`](Self::record_residual))
    /// rather than the statistics-only upper bound that [`set_stage`](Self::set_stage) fills in.
    /// Only an exact ratio can flag residual dominance: the bound is close to 1 for any layer
    /// whose input and output have the same mean and spread, which every post-LayerNorm block
    /// (BERT) has, so it would cry wolf on healthy models. The macros never compute the exact
    /// ratio (it needs both tensors' values at once); code that records by hand does.
    #[serde(default)]
    pub residual_ratio_exact: bool,
}

/// What kind of rule flagged a layer. Ordered by severity, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActivationAnomalyKind {
    /// At least one NaN value.
    Nan,
    /// At least one +Inf or -Inf value.
    Inf,
    /// Finite values too large (see `TensorStats::has_anomaly`).
    Explosion,
    /// Spread collapsed (`TensorStats::is_vanishing`) after the warm-up layers.
    Vanishing,
    /// `residual_ratio > RESIDUAL_DOMINANCE_THRESHOLD`.
    ResidualDominance,
}

impl ActivationAnomalyKind {
    /// NaN, Inf or explosion: a value is broken. Vanishing and residual dominance are
    /// heuristics about a layer that may be healthy, so they never hide a broken value.
    pub fn is_broken_value(self) -> bool {
        matches!(self, Self::Nan | Self::Inf | Self::Explosion)
    }
}

impl fmt::Display for ActivationAnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nan => "NaN",
            Self::Inf => "Inf",
            Self::Explosion => "explosion",
            Self::Vanishing => "vanishing",
            Self::ResidualDominance => "residual dominance",
        })
    }
}

impl LayerActivationTrace {
    /// An empty record for block `layer_idx`; fill it with [`set_stage`](Self::set_stage) or by
    /// assigning the fields.
    pub fn new(layer_idx: usize) -> Self {
        Self {
            layer_idx,
            ..Self::default()
        }
    }

    /// The statistics of a layer event's stages, and its exact residual ratio when one was
    /// recorded: what the anomaly rules read of a layer, from a session or a trace file.
    pub fn from_event(event: &LayerEvent) -> Self {
        let mut trace = Self::new(event.layer);
        for stage in &event.stages {
            trace.set_stage(&stage.name, stage.tensor.stats);
        }
        if let Some(ratio) = event.residual_ratio {
            trace.residual_ratio = ratio;
            trace.residual_ratio_exact = true;
        }
        trace
    }

    /// Stores `stats` under `name`: `input` and `output` fill their fields, any other name is a
    /// stage, kept in recording order (recording a name twice keeps the last value, in its first
    /// position).
    ///
    /// When this completes the input/output pair, `residual_ratio` is (re)computed from the two
    /// statistics with [`residual_ratio_from`](Self::residual_ratio_from), so that code which only
    /// has statistics (the macros) still see how much a layer changed its input. That bound is
    /// informative only; call [`record_residual`](Self::record_residual) afterwards to replace it
    /// by the exact value, which is what the residual-dominance rule reads.
    pub fn set_stage(&mut self, name: &str, stats: TensorStats) {
        match name {
            "input" => self.input_stats = stats,
            "output" => self.output_stats = stats,
            _ => {
                match self.stages.iter_mut().find(|(n, _)| n == name) {
                    Some((_, slot)) => *slot = stats,
                    None => self.stages.push((name.to_owned(), stats)),
                }
                return;
            }
        }
        if self.input_stats.count > 0 && self.output_stats.count > 0 {
            self.residual_ratio = Self::residual_ratio_from(&self.input_stats, &self.output_stats);
            self.residual_ratio_exact = false;
        }
    }

    /// The statistics recorded under `name` (`input`, `output` or a stage), if recorded.
    pub fn stage(&self, name: &str) -> Option<&TensorStats> {
        self.stages().find(|(n, _)| *n == name).map(|(_, s)| s)
    }

    /// Recorded stages in data-flow order: input, the stages in recording order, output.
    /// An unrecorded input or output is skipped.
    pub fn stages(&self) -> impl Iterator<Item = (&str, &TensorStats)> + '_ {
        std::iter::once(("input", &self.input_stats))
            .chain(self.stages.iter().map(|(n, s)| (n.as_str(), s)))
            .chain(std::iter::once(("output", &self.output_stats)))
            .filter(|(_, s)| s.count > 0)
    }

    /// Exact residual ratio of a block, from its input and output values:
    ///
    /// `ratio = ‖x‖ / (‖x‖ + ‖y − x‖)` with `x` the input, `y` the output, Euclidean norms.
    ///
    /// It is `1` when the block added nothing (`y = x`), `0.5` when the block's update is as
    /// large as its input, and tends to `0` when the update swamps the input. Unlike
    /// `1 − ‖y − x‖/‖y‖` it stays in `[0, 1]` and is defined when the output is zero. Returns
    /// `0.0` (nothing to flag) when the lengths differ, either side has a non-finite value (the
    /// NaN/Inf rules report those) or both norms are zero. One pass, no allocation.
    pub fn residual_ratio_of(input: &[f32], output: &[f32]) -> f32 {
        if input.len() != output.len() {
            return 0.0;
        }
        let (mut in_sq, mut delta_sq) = (0.0f64, 0.0f64);
        for (&x, &y) in input.iter().zip(output) {
            let (x, y) = (f64::from(x), f64::from(y));
            in_sq += x * x;
            delta_sq += (y - x) * (y - x);
        }
        ratio_from_norms(in_sq.sqrt(), delta_sq.sqrt())
    }

    /// Residual ratio from statistics only: the same formula as
    /// [`residual_ratio_of`](Self::residual_ratio_of) with `‖y − x‖` replaced by its lower bound
    ///
    /// `‖y − x‖ ≥ √n · √((mean_y − mean_x)² + (std_y − std_x)²)`
    ///
    /// (per element, `‖y − x‖²/n = (Δmean)² + var(y − x)` and `var(y − x) ≥ (std_y − std_x)²` by
    /// Cauchy–Schwarz). The result is therefore an **upper bound** of the exact ratio: equal to it
    /// when the output is a non-negative rescaling of the input around its mean, larger when the
    /// block rotates the residual stream without changing its spread. Residual dominance found
    /// with it can be a false alarm; a dominance it misses cannot exist.
    ///
    /// Returns `0.0` when the element counts differ, either side has a NaN or Inf, or either
    /// side is empty.
    pub fn residual_ratio_from(input: &TensorStats, output: &TensorStats) -> f32 {
        let clean = |s: &TensorStats| s.count > 0 && s.nan_count == 0 && s.inf_count == 0;
        if input.count != output.count || !clean(input) || !clean(output) {
            return 0.0;
        }
        #[allow(clippy::cast_precision_loss)]
        let n = input.count as f64;
        let d_mean = f64::from(output.mean) - f64::from(input.mean);
        let d_std = f64::from(output.std) - f64::from(input.std);
        let delta_lower = (n * (d_mean * d_mean + d_std * d_std)).sqrt();
        ratio_from_norms(f64::from(input.l2_norm), delta_lower)
    }

    /// Sets `residual_ratio` to the exact value from the block's input and output values (see
    /// [`residual_ratio_of`](Self::residual_ratio_of)); the statistics fields are left alone.
    pub fn record_residual(&mut self, input: &[f32], output: &[f32]) {
        self.residual_ratio = Self::residual_ratio_of(input, output);
        self.residual_ratio_exact = true;
    }
}

#[allow(clippy::cast_possible_truncation)]
fn ratio_from_norms(input_norm: f64, delta_norm: f64) -> f32 {
    let total = input_norm + delta_norm;
    if total > 0.0 && total.is_finite() {
        (input_norm / total) as f32
    } else {
        0.0
    }
}

/// All layers of one forward pass, and the verdict of the anomaly rules over them.
///
/// The rules, applied by [`find_anomalies`](crate::find_anomalies) to every recorded stage of
/// every layer (a session stores their verdict with [`set_verdict`](Self::set_verdict)):
///
/// 1. **NaN** (`nan_count > 0`), **Inf** (`inf_count > 0`), **explosion** (`TensorStats::has_anomaly`
///    without NaN/Inf: a finite value beyond ±1e6 or `std > 1e4`): any layer, any stage.
/// 2. **Vanishing**: `TensorStats::is_vanishing` (`std < 1e-6`, at least two finite values) on
///    any stage, in layers with `layer_idx >= VANISHING_WARMUP_LAYERS`.
/// 3. **Residual dominance**: `residual_ratio > RESIDUAL_DOMINANCE_THRESHOLD`, when the ratio is
///    exact (`residual_ratio_exact`, set by [`LayerActivationTrace::record_residual`]).
///
/// A session (and [`ModelTracer::record_logits`](crate::ModelTracer::record_logits), by hand)
/// also judges each logits tensor of the pass by rule 1: logits with a NaN, Inf or
/// exploding value are an anomaly of stage `logits` at the layer of the logits (one past the
/// last block for the model's head), so a step whose logits are broken is reported even when
/// every layer is clean. [`find_anomalies`](crate::find_anomalies) judges only `layers`.
///
/// Rule 1 (a broken value) beats rules 2 and 3 (a suspicious layer) across the whole pass: the
/// reported anomaly is the rule-1 anomaly in the layer with the **lowest `layer_idx`**, and only
/// when no layer breaks rule 1, the lowest layer breaking rule 2 or 3 (recording order breaks
/// ties), because the first layer that goes wrong is where debugging starts: a NaN at layer 17
/// poisons every later layer, and a heuristic flag at layer 2 must not hide it. Within a layer,
/// rule 1 beats 2 beats 3, and stages are checked in data-flow order (see
/// [`LayerActivationTrace::stages`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelActivationTrace {
    /// Position of the forward pass: `#[trace_model(position = ...)]`, else the number of
    /// passes before it; by hand, what [`ModelTracer::begin_forward`](crate::ModelTracer::begin_forward) was given.
    pub position: usize,
    /// Layers in recording order.
    pub layers: Vec<LayerActivationTrace>,
    /// Whether the pass has an anomaly (set with the other verdict fields by
    /// [`set_verdict`](Self::set_verdict)).
    pub has_anomaly: bool,
    /// The reported anomaly, e.g. `layer 17 resid_mid: NaN (3 of 576 values)`.
    pub anomaly_desc: Option<String>,
    /// `layer_idx` of the reported anomaly.
    pub anomaly_layer: Option<usize>,
    /// Rule that produced the reported anomaly.
    pub anomaly_kind: Option<ActivationAnomalyKind>,
    /// How many anomalies the pass has, the length of [`anomalies`](Self::anomalies): the
    /// layers that broke at least one rule and, from a session, the logits records with a
    /// broken value.
    pub anomalous_layers: usize,
    /// Every layer that broke a rule (and, from a session, every logits record with a broken
    /// value), in the order of the report: broken values (NaN, Inf, explosion) by layer index,
    /// then heuristic flags by layer index. The first one is the reported anomaly.
    #[serde(default)]
    pub anomalies: Vec<Anomaly>,
}

impl ModelActivationTrace {
    /// An empty trace with room for `num_layers` layers.
    pub fn with_capacity(num_layers: usize) -> Self {
        Self {
            layers: Vec::with_capacity(num_layers),
            ..Self::default()
        }
    }

    /// Appends one layer's record.
    pub fn add_layer(&mut self, layer: LayerActivationTrace) {
        self.layers.push(layer);
    }

    /// Stores the verdict of the anomaly rules (see the type's docs): `anomalies` in the order
    /// of the report, as [`find_anomalies`](crate::find_anomalies) gives them for
    /// [`layers`](Self::layers) (a session adds broken logits). Sets every verdict field from
    /// them, so the fields never disagree.
    pub fn set_verdict(&mut self, anomalies: Vec<Anomaly>) {
        let reported = anomalies.first();
        self.anomalous_layers = anomalies.len();
        self.has_anomaly = reported.is_some();
        self.anomaly_layer = reported.map(|a| a.layer);
        self.anomaly_kind = reported.map(|a| a.kind);
        self.anomaly_desc = reported.map(|a| a.description.clone());
        self.anomalies = anomalies;
    }
}

/// One layer's anomaly: the first rule it breaks (see [`ModelActivationTrace`] for the rules); or
/// broken logits, with `stage` `logits`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anomaly {
    /// `layer_idx` of the layer.
    pub layer: usize,
    /// The stage whose statistics broke the rule; `None` for residual dominance, which belongs
    /// to the layer.
    pub stage: Option<String>,
    /// The rule.
    pub kind: ActivationAnomalyKind,
    /// What was seen, e.g. `layer 17 resid_mid: NaN (3 of 576 values)`.
    pub description: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(values: &[f32]) -> TensorStats {
        TensorStats::from_slice(values)
    }

    #[test]
    fn set_stage_keeps_stages_in_order_between_input_and_output() {
        let mut layer = LayerActivationTrace::new(3);
        layer.set_stage("resid_mid", stats(&[1.0, 2.0]));
        layer.set_stage("q_proj", stats(&[1.0]));
        layer.set_stage("gate", stats(&[2.0]));
        layer.set_stage("q_proj", stats(&[3.0, 4.0]));
        let names: Vec<&str> = layer.stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["resid_mid", "q_proj", "gate"]);
        layer.set_stage("input", stats(&[5.0]));
        layer.set_stage("output", stats(&[6.0]));
        assert_eq!(layer.stages.len(), 3);
        assert_eq!(layer.stage("input").map(|s| s.mean), Some(5.0));
        assert_eq!(layer.stage("q_proj").map(|s| s.count), Some(2));
        assert!(layer.stage("mlp_out").is_none());
        let order: Vec<&str> = layer.stages().map(|(n, _)| n).collect();
        assert_eq!(order, ["input", "resid_mid", "q_proj", "gate", "output"]);
    }

    #[test]
    fn exact_residual_ratio() {
        let x = [3.0, 4.0];
        assert_eq!(LayerActivationTrace::residual_ratio_of(&x, &x), 1.0);
        // update as large as the input
        let y = [6.0, 8.0];
        assert!((LayerActivationTrace::residual_ratio_of(&x, &y) - 0.5).abs() < 1e-6);
        assert_eq!(LayerActivationTrace::residual_ratio_of(&x, &[1.0]), 0.0);
        assert_eq!(
            LayerActivationTrace::residual_ratio_of(&x, &[f32::NAN, 1.0]),
            0.0
        );
        assert_eq!(LayerActivationTrace::residual_ratio_of(&[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn stats_ratio_is_an_upper_bound_and_exact_for_rescaling() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        // a permutation: same statistics, large change
        let mut rotated = x.clone();
        rotated.reverse();
        let exact = LayerActivationTrace::residual_ratio_of(&x, &rotated);
        let bound = LayerActivationTrace::residual_ratio_from(&stats(&x), &stats(&rotated));
        assert!(bound >= exact);
        assert_eq!(bound, 1.0);
        // a rescale around the mean: the bound is exact
        let mean = x.iter().sum::<f32>() / x.len() as f32;
        let scaled: Vec<f32> = x.iter().map(|v| mean + 1.5 * (v - mean) + 0.25).collect();
        let exact = LayerActivationTrace::residual_ratio_of(&x, &scaled);
        let bound = LayerActivationTrace::residual_ratio_from(&stats(&x), &stats(&scaled));
        assert!((bound - exact).abs() < 1e-4, "{bound} vs {exact}");
    }

    #[test]
    fn set_stage_computes_residual_ratio_when_the_pair_is_complete() {
        let mut layer = LayerActivationTrace::new(0);
        layer.set_stage("output", stats(&[1.0, 2.0]));
        assert_eq!(layer.residual_ratio, 0.0);
        layer.set_stage("input", stats(&[1.0, 2.0]));
        assert_eq!(layer.residual_ratio, 1.0);
        layer.record_residual(&[1.0, 2.0], &[2.0, 1.0]);
        assert!(layer.residual_ratio < 0.7);
    }
}
