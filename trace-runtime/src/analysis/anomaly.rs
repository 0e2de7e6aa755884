//! The anomaly rules over one forward pass's layers (stated on
//! [`ModelActivationTrace`](crate::ModelActivationTrace)).

use crate::record::{
    ActivationAnomalyKind, Anomaly, LayerActivationTrace, RESIDUAL_DOMINANCE_THRESHOLD,
    VANISHING_WARMUP_LAYERS,
};
use crate::stats::TensorStats;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ActivationAnomalyKind, LayerActivationTrace, ModelActivationTrace};

    fn stats(values: &[f32]) -> TensorStats {
        TensorStats::from_slice(values)
    }

    fn healthy(idx: usize) -> LayerActivationTrace {
        let mut layer = LayerActivationTrace::new(idx);
        layer.set_stage("input", stats(&[1.0, -2.0, 3.0, 0.5]));
        layer.set_stage("output", stats(&[2.0, -1.0, 5.0, -0.5]));
        layer
    }

    #[test]
    fn empty_layers_are_not_anomalous() {
        let mut trace = ModelActivationTrace::with_capacity(32);
        for i in 0..32 {
            trace.add_layer(LayerActivationTrace::new(i));
        }
        trace.set_verdict(find_anomalies(&trace.layers));
        assert!(!trace.has_anomaly);
        assert_eq!(trace.anomalous_layers, 0);
    }

    #[test]
    fn reports_the_lowest_broken_layer_not_the_first_recorded() {
        let mut trace = ModelActivationTrace::default();
        for i in 0..20 {
            let mut layer = healthy(i);
            if i == 17 {
                let mut v = vec![0.5f32; 576];
                v[1] = f32::NAN;
                v[100] = f32::NAN;
                v[200] = f32::NAN;
                layer.set_stage("resid_mid", stats(&v));
            }
            if i == 19 {
                layer.set_stage("output", stats(&[f32::INFINITY, 1.0]));
            }
            trace.add_layer(layer);
        }
        trace.set_verdict(find_anomalies(&trace.layers));
        assert!(trace.has_anomaly);
        assert_eq!(trace.anomaly_layer, Some(17));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Nan));
        assert_eq!(
            trace.anomaly_desc.as_deref(),
            Some("layer 17 resid_mid: NaN (3 of 576 values)")
        );
        assert_eq!(trace.anomalous_layers, 2);

        // recorded out of order: layer 5 (Inf) was recorded after layer 9 (NaN)
        let mut trace = ModelActivationTrace::default();
        let mut nan = healthy(9);
        nan.set_stage("mlp_out", stats(&[f32::NAN]));
        trace.add_layer(nan);
        let mut inf = healthy(5);
        inf.set_stage("attn_in", stats(&[f32::INFINITY, 0.25]));
        trace.add_layer(inf);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(trace.anomaly_layer, Some(5));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Inf));

        // a heuristic flag (vanishing at layer 5) never hides a broken value (NaN at layer 9)
        let mut trace = ModelActivationTrace::default();
        let mut flat = healthy(5);
        flat.set_stage("attn_in", stats(&[0.25; 16]));
        trace.add_layer(flat);
        let mut nan = healthy(9);
        nan.set_stage("mlp_out", stats(&[f32::NAN]));
        trace.add_layer(nan);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(trace.anomaly_layer, Some(9));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Nan));
        assert_eq!(trace.anomalous_layers, 2);
    }

    #[test]
    fn vanishing_is_exempt_during_warmup_and_for_single_values() {
        let mut trace = ModelActivationTrace::default();
        for i in 0..VANISHING_WARMUP_LAYERS {
            let mut layer = healthy(i);
            layer.set_stage("attn_in", stats(&[1.0; 8]));
            trace.add_layer(layer);
        }
        let mut single = healthy(VANISHING_WARMUP_LAYERS);
        single.set_stage("scalar_gate", stats(&[0.3]));
        trace.add_layer(single);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert!(!trace.has_anomaly, "{:?}", trace.anomaly_desc);

        let mut late = healthy(VANISHING_WARMUP_LAYERS);
        late.set_stage("attn_in", stats(&[1.0; 8]));
        trace.add_layer(late);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Vanishing));
        assert_eq!(trace.anomaly_layer, Some(VANISHING_WARMUP_LAYERS));
    }

    #[test]
    fn explosion_and_residual_dominance() {
        let mut trace = ModelActivationTrace::default();
        let mut layer = healthy(4);
        layer.set_stage("mlp_out", stats(&[1.0, 2e7, 3.0]));
        trace.add_layer(layer);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Explosion));
        assert!(trace
            .anomaly_desc
            .as_deref()
            .is_some_and(|d| d.starts_with("layer 4 mlp_out: explosion")));

        let mut trace = ModelActivationTrace::default();
        let mut layer = LayerActivationTrace::new(6);
        let x = [1.0, -2.0, 3.0, 0.5];
        let y = [1.001, -2.0, 3.0, 0.5];
        layer.set_stage("input", stats(&x));
        layer.set_stage("output", stats(&y));
        layer.record_residual(&x, &y);
        trace.add_layer(layer);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(
            trace.anomaly_kind,
            Some(ActivationAnomalyKind::ResidualDominance)
        );
        assert!(trace
            .anomaly_desc
            .as_deref()
            .is_some_and(|d| d.starts_with("layer 6: residual dominance (residual ratio 0.99")));

        // A broken value in a later layer beats a heuristic flag in an earlier one.
        let mut nan_layer = healthy(7);
        nan_layer.set_stage("resid_mid", stats(&[1.0, f32::NAN]));
        trace.add_layer(nan_layer);
        trace.set_verdict(find_anomalies(&trace.layers));
        assert_eq!(trace.anomaly_layer, Some(7));
        assert_eq!(trace.anomaly_kind, Some(ActivationAnomalyKind::Nan));
        assert_eq!(trace.anomalous_layers, 2);
        trace.layers.pop();

        // the verdict is recomputed from scratch: a fixed problem is forgotten
        trace.layers[0].residual_ratio = 0.5;
        trace.set_verdict(find_anomalies(&trace.layers));
        assert!(!trace.has_anomaly);
        assert_eq!(trace.anomaly_desc, None);
    }
}
