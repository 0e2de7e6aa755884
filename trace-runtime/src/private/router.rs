//! The router hook: what `#[trace_router]` and `trace_router_value!` call with the router's
//! logits, weights and experts. It checks their shapes, reads them, and emits one
//! [`RouterEvent`] a call; the margins are computed in `record::routing`.

use super::hooks::{tensor_or_error, NOT_A_TENSOR};
use super::read::read_tensor;
use crate::record::{
    expert_load, labels, Event, ExpertGroups, RecordErrorKind, RoutedToken, RouterEvent,
    RouterScoring, RoutingRule,
};
use crate::session::registry;
use crate::tensor::TraceTensor;
use crate::tracepoint::callsite::Callsite;

/// The arguments of `#[trace_router(...)]` and `trace_router_value!`, evaluated after the
/// router ran.
pub struct RouterArgs<'a> {
    /// `layer = ..`; `None`: the enclosing layer.
    pub layer: Option<usize>,
    /// `scoring = ..`.
    pub scoring: RouterScoring,
    /// `groups = (groups, top_groups)`.
    pub groups: Option<(usize, usize)>,
    /// `bias = ..`: `None` when not given, else the value if it is a tensor.
    pub bias: Option<Option<&'a dyn TraceTensor>>,
}

/// What the router returned, as the probe found it.
pub enum RouterParts<'a> {
    /// `(logits, weights, experts)`, each `None` when it is not a tensor.
    Values([Option<&'a dyn TraceTensor>; 3]),
    /// An `Err` or a `None`: the router did not route, nothing to record.
    Absent,
    /// Not a `(logits, weights, experts)` tuple of tensors.
    NotRouting,
}

/// The shapes of one call: `rows` tokens, `experts` experts, `top_k` chosen per token.
#[derive(Clone, Copy)]
struct RouterDims {
    rows: usize,
    experts: usize,
    top_k: usize,
}

/// One router call: per token the experts chosen, their weights and how close the choice was,
/// per expert the tokens it received. Logits `[.., experts]`, weights and experts
/// `[.., top_k]` with as many rows; expert ids are read as numbers (`u32`, `i64`, floats).
/// Every mismatch is a record error of the tracepoint, and nothing is recorded.
pub fn record_router(cs: &'static Callsite, args: RouterArgs<'_>, parts: RouterParts<'_>) {
    if !cs.records() {
        return;
    }
    let Some(Inputs {
        logits,
        weights,
        experts,
        bias,
    }) = inputs(cs, parts, args.bias)
    else {
        return;
    };
    let Some(dims) = router_dims(cs, logits, weights, experts) else {
        return;
    };
    let groups = args
        .groups
        .map(|(groups, top_groups)| ExpertGroups { groups, top_groups });
    let generation = registry::active_generation();
    let Some((layer, plan)) = registry::with_session(generation, |s| {
        let layer = args.layer.unwrap_or_else(|| s.layer_or_final());
        (layer, s.plan(cs.tracepoint(), Some(layer)).without_rows())
    }) else {
        return;
    };
    let Some(read) = read_routing(cs, dims, weights, experts, bias) else {
        return;
    };
    let rule = RoutingRule {
        scoring: args.scoring,
        bias: read.bias.as_deref(),
        groups,
    };
    if let Err(reason) = rule.check(dims.experts) {
        cs.note_error(RecordErrorKind::Config, format!("router: {reason}"));
        return;
    }
    // Each token's record is made from the logits as they are read, without a copy of them.
    let mut tokens = None;
    let mut route = |values: &[f32]| {
        tokens = (values.len() == dims.rows * dims.experts)
            .then(|| routed_tokens(&rule, dims, values, &read));
    };
    let what = "router logits";
    let Some(summary) = read_tensor(
        generation,
        cs,
        what,
        Some(layer),
        plan,
        logits,
        Some(&mut route),
    ) else {
        return;
    };
    let Some(tokens) = tokens else {
        let message = format!(
            "router: the logits' values do not match their shape {:?}",
            logits.shape()
        );
        cs.note_error(RecordErrorKind::Shape, message);
        return;
    };
    let load = expert_load(dims.experts, &read.experts);
    let (tracepoint, function) = labels(Some(cs.tracepoint()));
    registry::with_session(generation, |s| {
        s.emit_record(|seq, pass| {
            Event::Router(RouterEvent {
                seq,
                pass,
                layer,
                tracepoint,
                function,
                scoring: args.scoring,
                groups,
                selection_bias: bias.is_some(),
                num_experts: dims.experts,
                top_k: dims.top_k,
                logits: summary,
                tokens,
                load,
            })
        });
    });
}

/// The tensors of one call.
struct Inputs<'a> {
    logits: &'a dyn TraceTensor,
    weights: &'a dyn TraceTensor,
    experts: &'a dyn TraceTensor,
    bias: Option<&'a dyn TraceTensor>,
}

/// The call's tensors; `None` (and the error noted) when one is not a tensor, or nothing to
/// record (the router returned an `Err` or a `None`).
fn inputs<'a>(
    cs: &'static Callsite,
    parts: RouterParts<'a>,
    bias: Option<Option<&'a dyn TraceTensor>>,
) -> Option<Inputs<'a>> {
    let [logits, weights, experts] = match parts {
        RouterParts::Values(values) => values,
        RouterParts::Absent => return None,
        RouterParts::NotRouting => {
            let message = format!(
                "router: the value is not a (logits, weights, experts) tuple of tensors \
                 (or an `Ok` or `Some` of one){NOT_A_TENSOR}"
            );
            cs.note_error(RecordErrorKind::NotATensor, message);
            return None;
        }
    };
    let (Some(logits), Some(weights), Some(experts)) = (
        tensor_or_error(cs, "router logits", logits),
        tensor_or_error(cs, "router weights", weights),
        tensor_or_error(cs, "router experts", experts),
    ) else {
        return None;
    };
    let bias = match bias {
        Some(bias) => Some(tensor_or_error(cs, "router bias", bias)?),
        None => None,
    };
    Some(Inputs {
        logits,
        weights,
        experts,
        bias,
    })
}

/// The call's dimensions, or `None` and a shape error: logits `[.., experts]`, weights and
/// experts `[.., top_k]` of the same shape and as many rows, `1 ≤ top_k ≤ experts`.
fn router_dims(
    cs: &'static Callsite,
    logits: &dyn TraceTensor,
    weights: &dyn TraceTensor,
    experts: &dyn TraceTensor,
) -> Option<RouterDims> {
    let (logit_shape, weight_shape, expert_shape) =
        (logits.shape(), weights.shape(), experts.shape());
    let split = |shape: &[usize]| {
        shape
            .split_last()
            .map(|(&last, rows)| (rows.iter().product::<usize>(), last))
    };
    let problem = match (split(&logit_shape), split(&expert_shape)) {
        (None, _) | (Some((_, 0)), _) => {
            Some(format!("logits of shape {logit_shape:?} have no experts"))
        }
        (_, None) | (_, Some((_, 0))) => {
            Some(format!("experts of shape {expert_shape:?} choose none"))
        }
        (Some((rows, num_experts)), Some((expert_rows, top_k))) => {
            if weight_shape != expert_shape {
                Some(format!(
                    "weights of shape {weight_shape:?} do not match experts of shape {expert_shape:?}"
                ))
            } else if expert_rows != rows {
                Some(format!(
                    "experts of shape {expert_shape:?} have {expert_rows} rows, logits of shape \
                     {logit_shape:?} {rows}"
                ))
            } else if top_k > num_experts {
                Some(format!(
                    "{top_k} experts chosen per token among {num_experts} (logits {logit_shape:?})"
                ))
            } else {
                return Some(RouterDims {
                    rows,
                    experts: num_experts,
                    top_k,
                });
            }
        }
    };
    cs.note_error(RecordErrorKind::Shape, format!("router: {}", problem?));
    None
}

/// The weights, the expert ids and the bias, read.
struct RoutingRead {
    weights: Vec<f32>,
    experts: Vec<u32>,
    bias: Option<Vec<f32>>,
}

/// Reads what the router chose: as many values as the shapes say, every id an expert's.
fn read_routing(
    cs: &'static Callsite,
    dims: RouterDims,
    weights: &dyn TraceTensor,
    experts: &dyn TraceTensor,
    bias: Option<&dyn TraceTensor>,
) -> Option<RoutingRead> {
    let read = |what: &str, tensor: &dyn TraceTensor| -> Option<Vec<f32>> {
        let mut values = Vec::new();
        match tensor.with_f32(&mut |data| values = data.to_vec()) {
            Ok(()) => Some(values),
            Err(error) => {
                cs.note_error(RecordErrorKind::Read, format!("router {what}: {error}"));
                None
            }
        }
    };
    let chosen = dims.rows * dims.top_k;
    let weights = read("weights", weights)?;
    let ids = read("experts", experts)?;
    let bias = match bias {
        Some(bias) => Some(read("bias", bias)?),
        None => None,
    };
    let shape_error = |message: String| {
        cs.note_error(RecordErrorKind::Shape, format!("router: {message}"));
    };
    if weights.len() != chosen || ids.len() != chosen {
        shape_error("the weights' or the experts' values do not match their shape".to_owned());
        return None;
    }
    let experts = match expert_ids(&ids, dims) {
        Ok(experts) => experts,
        Err(message) => {
            shape_error(message);
            return None;
        }
    };
    Some(RoutingRead {
        weights,
        experts,
        bias,
    })
}

/// The ids as integers, or which one is not an expert's, or the row that names an expert twice
/// (a router chooses k distinct experts: a row that repeats one is most likely a tensor read
/// with the wrong shape, such as a flat buffer taken for one token).
fn expert_ids(ids: &[f32], dims: RouterDims) -> Result<Vec<u32>, String> {
    let experts = ids
        .iter()
        .enumerate()
        .map(|(at, &id)| {
            if id >= 0.0 && id.fract() == 0.0 && (id as usize) < dims.experts {
                Ok(id as u32)
            } else {
                Err(format!(
                    "expert id {id} (row {}) is not one of the {} experts",
                    at / dims.top_k,
                    dims.experts
                ))
            }
        })
        .collect::<Result<Vec<u32>, String>>()?;
    for (row, chosen) in experts.chunks(dims.top_k).enumerate() {
        if let Some(twice) = chosen
            .iter()
            .enumerate()
            .find_map(|(i, id)| chosen[..i].contains(id).then_some(id))
        {
            return Err(format!(
                "row {row} chooses expert {twice} twice ({chosen:?}): the experts are read as \
                 [rows, top_k] and the logits as [rows, experts] (a flat buffer needs a \
                 TensorRef with its shape)"
            ));
        }
    }
    Ok(experts)
}

fn routed_tokens(
    rule: &RoutingRule<'_>,
    dims: RouterDims,
    logits: &[f32],
    read: &RoutingRead,
) -> Vec<RoutedToken> {
    let rows = logits
        .chunks(dims.experts)
        .zip(read.experts.chunks(dims.top_k))
        .zip(read.weights.chunks(dims.top_k));
    rows.enumerate()
        .map(|(row, ((logits, experts), weights))| {
            RoutedToken::from_routing(rule, row, logits, experts, weights)
        })
        .collect()
}
