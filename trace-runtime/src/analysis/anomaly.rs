//! The anomaly rules over one forward pass's layers (stated on
//! [`ModelActivationTrace`](crate::ModelActivationTrace)).

use crate::record::{
    ActivationAnomalyKind, Anomaly, LayerActivationTrace, RESIDUAL_DOMINANCE_THRESHOLD,
    VANISHING_WARMUP_LAYERS,
};
use crate::summary::TensorStats;

/// Every layer that breaks a rule, with the first rule it breaks, in the order of the report:
/// broken values (NaN, Inf, explosion) before heuristic flags (vanishing, residual dominance),
/// each group by layer index, recording order on ties.
pub fn find_anomalies(layers: &[LayerActivationTrace]) -> Vec<Anomaly> {
    find_pass_anomalies(layers, &[])
}

/// [`find_anomalies`] over a pass's layers and its logits records (`(layer, statistics)` of
/// each): logits with a broken value (NaN, Inf, explosion) are an anomaly of stage `logits` at
/// their layer, reported in the same order as the layers' (a NaN in layer 7 is reported
/// before the NaN logits it causes, one past the last layer). The heuristic rules do not apply
/// to logits.
pub(crate) fn find_pass_anomalies(
    layers: &[LayerActivationTrace],
    logits: &[(usize, TensorStats)],
) -> Vec<Anomaly> {
    let from_layers = layers.iter().filter_map(first_anomaly);
    let from_logits = logits
        .iter()
        .filter_map(|(layer, stats)| logits_anomaly(*layer, stats));
    let mut found: Vec<(usize, Anomaly)> = from_layers.chain(from_logits).enumerate().collect();
    found.sort_by_key(|(order, a)| (!a.kind.is_broken_value(), a.layer, *order));
    found.into_iter().map(|(_, a)| a).collect()
}

/// The stage of an anomaly found in logits.
pub(crate) const LOGITS_STAGE: &str = "logits";

/// The broken-value rule over one logits tensor.
fn logits_anomaly(layer: usize, stats: &TensorStats) -> Option<Anomaly> {
    stats
        .has_anomaly()
        .then(|| stage_anomaly(layer, broken_value_kind(stats), LOGITS_STAGE, stats))
}

/// NaN before Inf before explosion, for statistics with a broken value.
fn broken_value_kind(stats: &TensorStats) -> ActivationAnomalyKind {
    if stats.nan_count > 0 {
        ActivationAnomalyKind::Nan
    } else if stats.inf_count > 0 {
        ActivationAnomalyKind::Inf
    } else {
        ActivationAnomalyKind::Explosion
    }
}

/// The first rule `layer` breaks, by severity: NaN, Inf, explosion over all stages in data-flow
/// order; then vanishing; then residual dominance.
fn first_anomaly(layer: &LayerActivationTrace) -> Option<Anomaly> {
    if let Some((name, stats)) = layer.stages().find(|(_, s)| s.has_anomaly()) {
        let kind = broken_value_kind(stats);
        return Some(stage_anomaly(layer.layer_idx, kind, name, stats));
    }
    if layer.layer_idx >= VANISHING_WARMUP_LAYERS {
        // `is_vanishing` needs two finite values: a single value has no spread to lose.
        if let Some((name, stats)) = layer.stages().find(|(_, s)| s.is_vanishing()) {
            let kind = ActivationAnomalyKind::Vanishing;
            return Some(stage_anomaly(layer.layer_idx, kind, name, stats));
        }
    }
    let dominated =
        layer.residual_ratio_exact && layer.residual_ratio > RESIDUAL_DOMINANCE_THRESHOLD;
    dominated.then(|| Anomaly {
        layer: layer.layer_idx,
        stage: None,
        kind: ActivationAnomalyKind::ResidualDominance,
        description: format!(
            "layer {}: {} (residual ratio {:.4} > {RESIDUAL_DOMINANCE_THRESHOLD})",
            layer.layer_idx,
            ActivationAnomalyKind::ResidualDominance,
            layer.residual_ratio
        ),
    })
}

fn stage_anomaly(
    layer: usize,
    kind: ActivationAnomalyKind,
    stage: &str,
    s: &TensorStats,
) -> Anomaly {
    let what = match kind {
        ActivationAnomalyKind::Nan => format!("NaN ({} of {} values)", s.nan_count, s.count),
        ActivationAnomalyKind::Inf => format!("Inf ({} of {} values)", s.inf_count, s.count),
        // The statistics know best what overflowed; their text starts with "explosion".
        ActivationAnomalyKind::Explosion => s
            .anomaly_description()
            .unwrap_or_else(|| "explosion".to_owned()),
        ActivationAnomalyKind::Vanishing => format!("vanishing (std {:e})", s.std),
        ActivationAnomalyKind::ResidualDominance => kind.to_string(),
    };
    Anomaly {
        layer,
        stage: Some(stage.to_owned()),
        kind,
        description: format!("layer {layer} {stage}: {what}"),
    }
}
