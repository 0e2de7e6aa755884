//! `diff --isolated`: each layer's error inherited (OTHER against the reference) beside its own
//! (an isolated run of OTHER, every layer fed the reference's input, against the reference),
//! and the first layer wrong on its own.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use trace_runtime::compare::TensorComparison;

use super::routing::{LayerVerdict, RoutingReport, TokenDifference};
use super::{before_first_layer, ratio_text, TraceComparison};
use crate::style::Colors;

/// Each layer's error inherited (OTHER against the reference) and its own (ISOLATED against
/// the reference), in one pass.
#[derive(Serialize)]
pub(crate) struct LocalErrors<'a> {
    /// `{pass, layer, stage}` of the first tensor a layer computed out of tolerance when fed
    /// the reference's input, in the reference's execution order; `null`: every layer is
    /// within tolerance on its own.
    first_local_divergence: Option<LocalDivergence<'a>>,
    /// The pass of the table.
    local_table_pass: usize,
    /// Per layer: the worst tensor of OTHER and of ISOLATED, and their ratios to the tolerance.
    local_layers: Vec<LocalRow<'a>>,
    /// The isolated run was fed another file than REFERENCE (said, not refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation_warning: Option<String>,
    /// Per layer with routers: OTHER's routing verdict (inherited) and ISOLATED's (the
    /// layer's own, its router fed the reference's input); absent without routers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    local_routing: Vec<LocalRouting>,
    /// The first token ISOLATED routed differently by more than its logit error explains:
    /// a router wrong on its own; `null` where none (absent without routers).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_local_routing_divergence: Option<Option<&'a TokenDifference>>,
    /// OTHER's first divergence is in the embeddings (layer 0's `input`, before the first
    /// layer): what diverges after it is inherited from them, not from a layer (the JSON has
    /// it as `first_divergence.before_first_layer`).
    #[serde(skip)]
    embeddings_diverged: bool,
}

/// One layer's routing, inherited and local.
#[derive(Serialize)]
struct LocalRouting {
    layer: usize,
    /// OTHER against the reference (`null`: OTHER has no router in this layer).
    inherited: Option<LayerVerdict>,
    /// ISOLATED against the reference (`null`: ISOLATED has no router in this layer).
    local: Option<LayerVerdict>,
}

#[derive(Serialize)]
struct LocalDivergence<'a> {
    pass: usize,
    layer: usize,
    stage: &'a str,
    ratio: f64,
    relative_error: Option<f64>,
}

#[derive(Serialize)]
struct LocalRow<'a> {
    layer: usize,
    inherited: Option<WorstTensor<'a>>,
    local: Option<WorstTensor<'a>>,
}

#[derive(Serialize)]
struct WorstTensor<'a> {
    stage: &'a str,
    ratio: f64,
    relative_error: Option<f64>,
    /// Whether the relative error is exact (both tensors captured) or estimated from the
    /// sketches, in which case `ratio` is only a lower bound of the error over the tolerance.
    exact: bool,
    /// Compared by summaries, within their bounds, but the estimated relative error is past
    /// the tolerance's `rtol`: the summaries cannot tell; captures would.
    undecided: bool,
}

impl<'a> WorstTensor<'a> {
    fn new((pair, ratio): (&'a TensorComparison, f64)) -> Self {
        let exact = pair.error.exact;
        let undecided = !exact
            && ratio <= 1.0
            && pair
                .error
                .relative_error
                .is_some_and(|e| e > pair.tolerance.rtol);
        Self {
            stage: &pair.name,
            ratio,
            relative_error: pair.error.relative_error,
            exact,
            undecided,
        }
    }
}

impl<'a> LocalErrors<'a> {
    pub(crate) fn new(
        other: &'a TraceComparison,
        isolated: &'a TraceComparison,
        isolation_warning: Option<String>,
    ) -> Self {
        let (inherited, local) = (other.worst_by_layer(), isolated.worst_by_layer());
        let layers: BTreeSet<usize> = inherited.keys().chain(local.keys()).copied().collect();
        // Summaries prove a divergence, never its absence: said when the local errors rest on
        // them, since a layer's own error can then pass unseen.
        let estimated = local.values().any(|(pair, _)| !pair.error.exact);
        let isolation_warning = isolation_warning.or_else(|| {
            estimated.then(|| {
                "the isolated run's tensors were compared by their summaries (one side has no \
                 captures): a layer within their bounds may still be wrong on its own (marked \
                 undecided where the estimate says so); capture both runs \
                 (MODEL_TRACE_CAPTURE=layer:*, or the examples' --capture pass=0) to decide"
                    .to_owned()
            })
        });
        Self {
            first_local_divergence: isolated.first().map(|pair| LocalDivergence {
                pass: pair.pass,
                layer: pair.layer,
                stage: &pair.name,
                ratio: pair.ratio(),
                relative_error: pair.error.relative_error,
            }),
            local_table_pass: isolated.table_pass(),
            embeddings_diverged: other.first().is_some_and(before_first_layer),
            local_layers: layers
                .into_iter()
                .map(|layer| LocalRow {
                    layer,
                    inherited: inherited.get(&layer).copied().map(WorstTensor::new),
                    local: local.get(&layer).copied().map(WorstTensor::new),
                })
                .collect(),
            isolation_warning,
            local_routing: local_routing(other.routing(), isolated.routing()),
            first_local_routing_divergence: isolated
                .routing()
                .map(|routing| routing.first_divergence.as_ref()),
        }
    }

    /// Whether a layer is wrong on its own.
    pub(crate) fn diverged(&self) -> bool {
        self.first_local_divergence.is_some()
    }

    /// The text `diff --isolated` adds to `diff`'s: a warning, the verdict, and the table of
    /// each layer's inherited and own error.
    pub(crate) fn text(&self, out: &mut String, colors: &Colors) {
        let _ = writeln!(out);
        if let Some(warning) = &self.isolation_warning {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        self.verdict(out, colors);
        self.table(out, colors);
        self.routing(out, colors);
    }

    /// With routers: the first router wrong on its own, or that none is, and per layer the
    /// routing inherited and local.
    fn routing(&self, out: &mut String, colors: &Colors) {
        let Some(first) = self.first_local_routing_divergence else {
            return;
        };
        match first {
            Some(token) => {
                let _ = writeln!(
                    out,
                    "{} pass {}, layer {}, row {}: fed the reference's input, this layer's router \
                     chose experts {:?} where the reference chose {:?}, by a logit margin of \
                     {:.3e} against an error of {}",
                    colors.bad("first router wrong on its own:"),
                    token.pass.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                    token.layer,
                    token.row,
                    token.other_experts,
                    token.reference_experts,
                    token.reference_logit_margin,
                    token.logit_error.map_or_else(
                        || "unknown (no expert listed by both)".to_owned(),
                        |e| format!("{e:.3e}")
                    )
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good(
                        "no router is wrong on its own: fed the reference's input, every token \
                         that chose other experts is a near-tie"
                    )
                );
            }
        }
        let words = |verdict: Option<LayerVerdict>| verdict.map_or("-", LayerVerdict::word);
        let _ = writeln!(
            out,
            "{}",
            colors.bold("layer  routing inherited  local, isolated")
        );
        for row in &self.local_routing {
            let _ = writeln!(
                out,
                "{:>5}  {:<17}  {}",
                row.layer,
                words(row.inherited),
                words(row.local)
            );
        }
    }

    /// The first layer wrong on its own; or, none, whether summaries leave layers undecided,
    /// and where what diverged comes from.
    fn verdict(&self, out: &mut String, colors: &Colors) {
        let undecided: Vec<usize> = self
            .local_layers
            .iter()
            .filter(|row| row.local.as_ref().is_some_and(|w| w.undecided))
            .map(|row| row.layer)
            .collect();
        match &self.first_local_divergence {
            None if !undecided.is_empty() => {
                let _ = writeln!(
                    out,
                    "{} layers {undecided:?} are within what the summaries can bound, but their \
                     estimated error is past the tolerance: capture the isolated run to decide",
                    colors.warn("undecided:")
                );
            }
            None if self.embeddings_diverged => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good(
                        "no layer is wrong on its own: fed the reference's input, every layer \
                         stays within tolerance; what diverged above starts before the first \
                         layer, in the embeddings, and the layers inherit it"
                    )
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good(
                        "no layer is wrong on its own: fed the reference's input, every layer \
                         stays within tolerance (what diverged above is inherited drift)"
                    )
                );
            }
            Some(place) => {
                let _ = writeln!(
                    out,
                    "{} pass {}, layer {}, {}: fed the reference's input, this layer's {} is \
                     {} times what the tolerance allows",
                    colors.bad("first layer wrong on its own:"),
                    place.pass,
                    place.layer,
                    colors.bold(place.stage),
                    place.stage,
                    ratio_text(place.ratio).trim_end_matches('x')
                );
            }
        }
    }

    /// Per layer, its worst tensor inherited and local, and what that makes of the layer.
    fn table(&self, out: &mut String, colors: &Colors) {
        let _ = writeln!(
            out,
            "{}",
            colors.bold(&format!(
                "layer  inherited (pass {})                local, isolated",
                self.local_table_pass
            ))
        );
        for row in &self.local_layers {
            let _ = writeln!(
                out,
                "{:>5}  {}   {}   {}",
                row.layer,
                WorstTensor::cell(row.inherited.as_ref()),
                WorstTensor::cell(row.local.as_ref()),
                self.row_verdict(row, colors)
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim(
                "(each side: the layer's worst tensor, its ratio to the tolerance and ‖b − a‖/‖a‖; \
                 local: the same layer fed the reference's input, its inputs left out)"
            )
        );
    }

    /// What a row of the table makes of its layer: wrong on its own, inheriting from the
    /// embeddings, undecided, inheriting, or nothing.
    fn row_verdict(&self, row: &LocalRow<'_>, colors: &Colors) -> String {
        let own = row.local.as_ref().is_some_and(|w| w.ratio > 1.0);
        let undecided = row.local.as_ref().is_some_and(|w| w.undecided);
        let inherited = row.inherited.as_ref().is_some_and(|w| w.ratio > 1.0);
        let embeddings = self.embeddings_diverged && row.layer == 0;
        if own {
            colors.bad("wrong on its own")
        } else if embeddings && inherited {
            colors.warn("from the embeddings (before the first layer)")
        } else if undecided {
            colors.warn("undecided: capture to tell")
        } else if inherited {
            colors.dim("inherited")
        } else {
            String::new()
        }
    }
}

impl WorstTensor<'_> {
    /// One side's cell of the table: the tensor, its ratio and its relative error (`≈` where
    /// estimated), or `-`.
    fn cell(worst: Option<&Self>) -> String {
        match worst {
            None => format!("{:<31}", "-"),
            Some(w) => {
                let estimate = if w.exact { "" } else { "≈" };
                let error = w
                    .relative_error
                    .map_or_else(|| "-".to_owned(), |e| format!("{estimate}{e:.2e}"));
                format!("{:<12} {:>7} {:>10}", w.stage, ratio_text(w.ratio), error)
            }
        }
    }
}

/// Per layer with routers in either comparison, its verdict in each.
fn local_routing(
    inherited: Option<&RoutingReport>,
    local: Option<&RoutingReport>,
) -> Vec<LocalRouting> {
    let verdicts = |report: Option<&RoutingReport>| {
        (report.iter())
            .flat_map(|r| &r.layers)
            .map(|l| (l.layer, l.verdict))
            .collect::<std::collections::BTreeMap<usize, LayerVerdict>>()
    };
    let (inherited, local) = (verdicts(inherited), verdicts(local));
    let layers: BTreeSet<usize> = inherited.keys().chain(local.keys()).copied().collect();
    (layers.into_iter())
        .map(|layer| LocalRouting {
            layer,
            inherited: inherited.get(&layer).copied(),
            local: local.get(&layer).copied(),
        })
        .collect()
}

/// A warning when the isolated run was fed another reference than the one compared with, or
/// is no isolated run at all.
pub(crate) fn fed_from_elsewhere(
    reference: &Path,
    isolated_path: &Path,
    isolated: &TraceComparison,
) -> Option<String> {
    let Some(fed) = isolated.other_isolated_from() else {
        return Some(format!(
            "{} is no isolated run (its header names no reference it was fed): its errors are \
             not each layer's own (run the port with MODEL_TRACE_ISOLATE={})",
            isolated_path.display(),
            reference.display()
        ));
    };
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    // The header names the path as the run was given it, relative to where it ran.
    let fed_path = Path::new(fed);
    let by_name = fed_path.file_name() == reference.file_name();
    (!same(fed_path, reference) && !by_name).then(|| {
        format!(
            "{} was fed the inputs of {fed}, not of {}",
            isolated_path.display(),
            reference.display()
        )
    })
}
