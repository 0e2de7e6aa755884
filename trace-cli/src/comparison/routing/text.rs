//! The routing comparison as `diff` prints it: the counts, the first token routed differently
//! and the first divergence, a table of the layers, and what a user should know besides.

use std::fmt::Write as _;

use super::layer::{LayerRouting, LayerVerdict};
use super::logits::RouterInput;
use super::{RoutingReport, RoutingVerdict, TokenDifference};
use crate::style::Colors;

impl RoutingReport {
    /// The routing section of `diff`'s text.
    pub(crate) fn text(&self, out: &mut String, colors: &Colors) {
        for note in &self.notes {
            let _ = writeln!(out, "{}", colors.warn(&format!("routing: {note}")));
        }
        if self.tokens == 0 {
            return;
        }
        self.counts(out, colors);
        if let Some(first) = &self.first_difference {
            let _ = writeln!(out, "{}", first_line(first, colors));
        }
        match (&self.first_divergence, &self.first_difference) {
            (Some(divergence), Some(first)) if !same_token(divergence, first) => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.bad(&format!("first routing divergence: {}", place(divergence)))
                );
                let _ = writeln!(out, "  {}", verdict_text(divergence));
            }
            _ => {}
        }
        self.layer_table(out, colors);
        for layer in &self.layers {
            layer_lines(out, layer, colors);
        }
    }

    /// `routing: 48 tokens in 3 layers compared: 2 routed differently (...), 1 ...`.
    fn counts(&self, out: &mut String, colors: &Colors) {
        let differing = if self.differing > 0 {
            format!(
                "{} routed differently ({}, {})",
                self.differing,
                counted(self.near_ties, "near-tie", "near-ties"),
                counted(self.divergences, "divergence", "divergences")
            )
        } else {
            "every one chose the same experts".to_owned()
        };
        let _ = writeln!(
            out,
            "{} {} tokens in {} layers compared ({} router calls in the reference, {} in the \
             other): {differing}; {} with other weights past the logit error",
            colors.bold("routing:"),
            self.tokens,
            self.layers.len(),
            self.reference_calls,
            self.other_calls,
            self.weights_differ
        );
    }

    /// Per layer: tokens, differences by kind, the largest logit error and the verdict; with a
    /// floor, the floor's differences and whether the layer is within them.
    fn layer_table(&self, out: &mut String, colors: &Colors) {
        let floor = self.floor_calls.is_some();
        let _ = writeln!(
            out,
            "{}",
            colors.bold(&format!(
                "layer  tokens  differ  near-ties  diverge  weights  max logit err  {}routing",
                if floor { "floor differ/weights  " } else { "" }
            ))
        );
        for layer in &self.layers {
            let error = layer
                .max_logit_error
                .map_or_else(|| "-".to_owned(), |e| format!("{e:.2e}"));
            let floor_cells = layer.floor.filter(|_| floor).map_or_else(
                || {
                    if floor {
                        format!("{:>20}  ", "-")
                    } else {
                        String::new()
                    }
                },
                |f| format!("{:>20}  ", format!("{}/{}", f.differing, f.weights_differ)),
            );
            let _ = writeln!(
                out,
                "{:>5}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>13}  {floor_cells}{}",
                layer.layer,
                layer.tokens,
                layer.differing,
                layer.near_ties,
                layer.divergences,
                layer.weights_differ,
                error,
                layer_verdict_text(layer, colors)
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim(
                "(differ: tokens whose chosen experts differ as a set; a near-tie when the \
                 reference's logit margin is within the other's router-logit error on that token, \
                 the largest |other − reference| over the logits both list (softmax routers: \
                 each side less its mean over them), else a divergence; weights: tokens that \
                 chose alike whose weights differ past what that error explains)"
            )
        );
    }
}

/// A layer's verdict word, coloured by what it means, with the floor's excuse.
fn layer_verdict_text(layer: &LayerRouting, colors: &Colors) -> String {
    let word = layer.verdict.word();
    match layer.verdict {
        LayerVerdict::Same => colors.good(word),
        LayerVerdict::NearTies => colors.dim(word),
        _ if layer.within_floor == Some(true) => format!("{word} (within the floor's)"),
        _ => colors.bad(word),
    }
}

/// The lines under the table about one layer: the experts' computation against the choice,
/// the worst weights.
fn layer_lines(out: &mut String, layer: &LayerRouting, colors: &Colors) {
    router_logits_line(out, layer, colors);
    if layer.computation_not_choice {
        let _ = writeln!(
            out,
            "{}",
            colors.warn(&format!(
                "layer {}: routing matches, but mlp_out diverges: the experts' computation, not \
                 the choice",
                layer.layer
            ))
        );
    }
    if layer.mlp_out_diverged && layer.verdict == LayerVerdict::Routing {
        let _ = writeln!(
            out,
            "{}",
            colors.bad(&format!(
                "layer {}: mlp_out diverges, and {} chose other experts than the logit error \
                 explains: the choice may be what differs",
                layer.layer,
                counted(layer.divergences, "token", "tokens")
            ))
        );
    }
    if let Some(worst) = &layer.worst_weights {
        let w = &worst.weight;
        let _ = writeln!(
            out,
            "layer {}: {} tokens chose alike with other weights; the worst, {}row {}: expert {} \
             weighs {:.6} in the reference, {:.6} in the other (allowed ±{:.2e} by a logit \
             error of {:.2e})",
            layer.layer,
            layer.weights_differ,
            worst
                .pass
                .map_or_else(String::new, |p| format!("pass {p}, ")),
            worst.row,
            w.expert,
            w.reference,
            w.other,
            w.allowed,
            worst.logit_error
        );
    }
}

/// Where the router logits are beyond the stages' tolerance from an input within it: the
/// router's own computation differs, and the near-ties it flipped are its doing.
fn router_logits_line(out: &mut String, layer: &LayerRouting, colors: &Colors) {
    let Some(logits) = layer.router_logits.as_ref().filter(|l| l.own_error) else {
        return;
    };
    let input = match (logits.input, logits.input_ratio) {
        (RouterInput::NotTraced, _) | (_, None) => {
            ", with mlp_in not traced (an inherited error cannot be ruled out)".to_owned()
        }
        (_, Some(input)) => format!(
            ": {:.3} times the tolerance, from an mlp_in at {input:.3} times it",
            logits.ratio
        ),
    };
    let floor = logits
        .floor_rms_error
        .map_or_else(String::new, |f| format!(", the floor's {f:.2e}"));
    let flips = if layer.near_ties > 0 {
        format!(
            "; its {} explained by that error",
            counted(layer.near_ties, "near-tie is", "near-ties are")
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{}",
        colors.bad(&format!(
            "layer {}: the router's own logits differ: RMS error {:.2e} on {} logits listed by \
             both (the reference's RMS {:.2e}{floor}), beyond the stages' tolerance ({} atol \
             {:e}, rtol {:e}){input}: the router's computation (its gate weights, its \
             precision){flips}",
            layer.layer,
            logits.rms_error,
            logits.compared,
            logits.rms_reference,
            logits.criterion,
            logits.atol,
            logits.rtol
        ))
    );
}

/// `1 near-tie`, `2 near-ties`.
fn counted(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// Whether two differences are of the same token.
fn same_token(a: &TokenDifference, b: &TokenDifference) -> bool {
    (a.pass, a.layer, &a.tracepoint, a.row) == (b.pass, b.layer, &b.tracepoint, b.row)
}

/// `pass 0, layer 1, row 3 (position 3): experts [2, 5] vs [2, 6]`.
fn place(d: &TokenDifference) -> String {
    let pass = d.pass.map_or_else(String::new, |p| format!("pass {p}, "));
    let position = d
        .position
        .map_or_else(String::new, |p| format!(" (position {p})"));
    format!(
        "{pass}layer {}, row {}{position}: experts {:?} vs {:?}",
        d.layer, d.row, d.reference_experts, d.other_experts
    )
}

/// The headline: the first token routed differently, and its verdict.
fn first_line(d: &TokenDifference, colors: &Colors) -> String {
    let line = format!(
        "first token routed differently: {}: {}",
        place(d),
        verdict_text(d)
    );
    match d.verdict {
        RoutingVerdict::NearTie => colors.warn(&line),
        RoutingVerdict::Divergence => colors.bad(&line),
    }
}

/// `near-tie (the reference's logit margin 1.2e-3 ≤ the other's router-logit error 3e-3)`;
/// an unknown error said as such, never as a number.
fn verdict_text(d: &TokenDifference) -> String {
    let Some(error) = d.logit_error else {
        return format!(
            "{} (the reference's logit margin {:.3e}; the other's router-logit error unknown: no \
             expert listed by both, on this token or any other of the layer; a rounding error \
             flips the closest choice, it does not replace every expert the reference lists)",
            d.verdict.word(),
            d.reference_logit_margin
        );
    };
    let estimated = if d.logit_error_estimated {
        ", estimated: the two list no expert in common, so the layer's largest measured"
    } else {
        ""
    };
    let relation = match d.verdict {
        RoutingVerdict::NearTie => "≤",
        RoutingVerdict::Divergence => ">",
    };
    format!(
        "{} (the reference's logit margin {:.3e} {relation} the other's router-logit error \
         {error:.3e}{estimated})",
        d.verdict.word(),
        d.reference_logit_margin,
    )
}
