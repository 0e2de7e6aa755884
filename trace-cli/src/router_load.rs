//! A run's routers, layer by layer over every call: how many tokens each expert received, how
//! unevenly, the tokens chosen by the narrowest margins, and the tokens whose chosen experts are
//! not the top-k of their own scores (`summary`, and `report`'s heat map).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use trace_runtime::RouterEvent;

use crate::style::Colors;

/// Tokens of the narrowest margins kept per layer.
const NARROWEST: usize = 3;

/// The routers of a run, folded call by call.
#[derive(Debug, Default)]
pub(crate) struct RouterTally {
    layers: BTreeMap<usize, LayerLoad>,
}

/// One layer's routers over every call.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct LayerLoad {
    pub(crate) layer: usize,
    pub(crate) calls: usize,
    pub(crate) tokens: usize,
    /// The largest `num_experts` and `top_k` of its calls.
    pub(crate) num_experts: usize,
    pub(crate) top_k: usize,
    /// Tokens routed to each expert, by expert id, summed over the calls.
    pub(crate) load: Vec<usize>,
    /// The largest load over the mean load (1: perfectly even; `null` without tokens).
    pub(crate) imbalance: Option<f64>,
    /// Experts that received no token.
    pub(crate) idle_experts: usize,
    /// The tokens chosen by the narrowest margins, narrowest first.
    pub(crate) narrowest: Vec<NarrowToken>,
    /// Tokens whose margin is negative: the chosen experts are not the top-k of their own
    /// selection scores (the indices do not follow the logits).
    pub(crate) not_top_k: usize,
    /// Tokens whose margin is exactly 0: a tie the router broke one way.
    pub(crate) ties: usize,
    /// Tokens whose margin is NaN (a NaN score).
    pub(crate) nan_margins: usize,
}

/// A token and how narrowly it chose its experts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NarrowToken {
    pub(crate) pass: Option<usize>,
    pub(crate) row: usize,
    pub(crate) experts: Vec<u32>,
    pub(crate) runner_up: Option<u32>,
    pub(crate) margin: f32,
    pub(crate) logit_margin: f32,
}

impl RouterTally {
    /// Folds in one router call.
    pub(crate) fn accept(&mut self, call: &RouterEvent) {
        let layer = self.layers.entry(call.layer).or_insert_with(|| LayerLoad {
            layer: call.layer,
            ..LayerLoad::default()
        });
        layer.calls += 1;
        layer.tokens += call.tokens.len();
        layer.num_experts = layer.num_experts.max(call.num_experts);
        layer.top_k = layer.top_k.max(call.top_k);
        if layer.load.len() < call.load.len() {
            layer.load.resize(call.load.len(), 0);
        }
        for (total, load) in layer.load.iter_mut().zip(&call.load) {
            *total += load;
        }
        for token in &call.tokens {
            if token.margin.is_nan() {
                layer.nan_margins += 1;
                continue;
            }
            layer.not_top_k += usize::from(token.margin < 0.0);
            layer.ties += usize::from(token.margin == 0.0);
            layer.offer_narrow(NarrowToken {
                pass: call.pass,
                row: token.row,
                experts: token.experts.clone(),
                runner_up: token.runner_up,
                margin: token.margin,
                logit_margin: token.logit_margin,
            });
        }
    }

    /// Whether no router call was folded in.
    pub(crate) fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Each layer's figures, in layer order.
    pub(crate) fn layers(&self) -> Vec<LayerLoad> {
        let mut layers: Vec<LayerLoad> = self.layers.values().cloned().collect();
        for layer in &mut layers {
            layer.finish();
        }
        layers
    }
}

impl LayerLoad {
    /// Keeps `token` if it is among the [`NARROWEST`] margins so far.
    fn offer_narrow(&mut self, token: NarrowToken) {
        let at = self
            .narrowest
            .partition_point(|kept| kept.margin <= token.margin);
        if at < NARROWEST {
            self.narrowest.insert(at, token);
            self.narrowest.truncate(NARROWEST);
        }
    }

    /// The imbalance and the idle experts, from the load.
    fn finish(&mut self) {
        let total: usize = self.load.iter().sum();
        self.idle_experts = self.load.iter().filter(|&&n| n == 0).count();
        #[allow(clippy::cast_precision_loss)]
        let mean = total as f64 / self.load.len().max(1) as f64;
        let largest = self.load.iter().copied().max().unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let imbalance = (total > 0).then(|| largest as f64 / mean);
        self.imbalance = imbalance;
    }
}

/// `summary`'s text of the routers: a table of the layers, then the tokens that did not choose
/// the top-k of their own scores, said plainly, and each layer's load.
pub(crate) fn summary_text(out: &mut String, layers: &[LayerLoad], colors: &Colors) {
    let calls: usize = layers.iter().map(|l| l.calls).sum();
    let _ = writeln!(
        out,
        "\n{} {calls} router calls in {} layers",
        colors.bold("routers:"),
        layers.len()
    );
    let _ = writeln!(
        out,
        "{}",
        colors.bold(
            "layer  calls  tokens  experts  top-k  imbalance  idle  margin<0  ties  narrowest margins"
        )
    );
    for layer in layers {
        let not_top_k = if layer.not_top_k > 0 {
            colors.bad(&format!("{:>8}", layer.not_top_k))
        } else {
            format!("{:>8}", 0)
        };
        let _ = writeln!(
            out,
            "{:>5}  {:>5}  {:>6}  {:>7}  {:>5}  {:>9}  {:>4}  {not_top_k}  {:>4}  {}",
            layer.layer,
            layer.calls,
            layer.tokens,
            layer.num_experts,
            layer.top_k,
            layer
                .imbalance
                .map_or_else(|| "-".to_owned(), |i| format!("{i:.2}")),
            layer.idle_experts,
            layer.ties,
            narrowest_text(&layer.narrowest)
        );
    }
    let _ = writeln!(
        out,
        "{}",
        colors.dim(
            "(imbalance: the busiest expert's tokens over the mean; idle: experts that got no \
             token; margin: the weakest chosen expert's selection score minus the runner-up's, \
             by pass and row; ties: tokens whose margin is exactly 0)"
        )
    );
    for layer in layers
        .iter()
        .filter(|l| l.not_top_k > 0 || l.nan_margins > 0)
    {
        let _ = writeln!(out, "{}", colors.bad(&not_top_k_text(layer)));
    }
    let _ = writeln!(
        out,
        "{}",
        colors.bold("load per expert (tokens routed to each, by expert id, over every call):")
    );
    for layer in layers {
        let load: Vec<String> = layer.load.iter().map(usize::to_string).collect();
        let _ = writeln!(out, "{:>5}  {}", layer.layer, load.join(" "));
    }
}

/// What a layer's negative or NaN margins mean, in words.
fn not_top_k_text(layer: &LayerLoad) -> String {
    let mut said = Vec::new();
    if layer.not_top_k > 0 {
        said.push(format!(
            "{} of its {} tokens chose experts that are not the top-{} of their own selection \
             scores (margin < 0): the router's chosen indices do not follow its logits",
            layer.not_top_k, layer.tokens, layer.top_k
        ));
    }
    if layer.nan_margins > 0 {
        said.push(format!(
            "{} tokens have a NaN margin (a NaN score)",
            layer.nan_margins
        ));
    }
    format!("layer {}: {}", layer.layer, said.join("; "))
}

/// `2.1e-3 (pass 0, row 2), 4.0e-2 (pass 1, row 0)`.
fn narrowest_text(tokens: &[NarrowToken]) -> String {
    let texts: Vec<String> = (tokens.iter())
        .map(|t| {
            let pass = t.pass.map_or_else(String::new, |p| format!("pass {p}, "));
            format!("{:.2e} ({pass}row {})", t.margin, t.row)
        })
        .collect();
    texts.join(", ")
}
