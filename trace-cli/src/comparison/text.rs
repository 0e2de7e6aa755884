//! What a comparison reports, as text: the traces and tolerances, the counts, the first
//! divergence and what differs there, the first token divergence, and the per-layer table.

use std::fmt::Write as _;

use trace_runtime::compare::{
    full_name, Check, ErrorMeasure, TensorKey, Tolerances, Unmatched, Verdict,
};

use super::default_tolerance::{ToleranceChoice, ToleranceRule};
use super::diff_report::{unlike_text, DiffReport, Divergence};
use super::floor::{NoFloor, TensorJudgement};
use super::tokens::TokenVerdict;
use crate::style::Colors;

/// Unmatched tensors listed in the text output before "... and N more".
const SHOWN_UNMATCHED: usize = 8;

/// Checks out of tolerance listed under the first divergence before "... and N more".
const SHOWN_CHECKS: usize = 6;

impl DiffReport<'_> {
    /// The report as `diff` prints it: the traces, then what matched and what did not, the
    /// warnings, the first divergence and the first token divergence, and the per-layer table.
    pub(crate) fn text(&self, colors: &Colors) -> String {
        let mut out = String::new();
        self.traces(&mut out, colors);
        self.counts(&mut out, colors);
        self.warnings(&mut out, colors);
        let _ = writeln!(out);
        self.first_divergences(&mut out, colors);
        if let Some(routing) = self.routing {
            let _ = writeln!(out);
            routing.text(&mut out, colors);
        }
        let _ = writeln!(out);
        self.layer_table(&mut out, colors);
        if let Some(split) = &self.split {
            let _ = writeln!(out);
            split.text(&mut out, colors);
        }
        out
    }

    /// The traces compared, the tolerance, the floor; what cut a trace short, isolated it or
    /// changed it.
    fn traces(&self, out: &mut String, colors: &Colors) {
        for (label, info) in [("reference:", self.reference), ("other:    ", self.other)] {
            let ranks = info
                .ranks
                .map_or_else(String::new, |n| format!(", {n} rank files"));
            let _ = writeln!(
                out,
                "{} {} ({}{ranks}, {} tensors)",
                colors.bold(label),
                info.path,
                info.writer,
                info.tensors
            );
        }
        tolerance(out, colors, self.tolerance);
        tolerance_choice(out, self.tolerance_choice);
        if let Some(split) = &self.split {
            let quantized = split.quantized;
            let _ = writeln!(
                out,
                "{} {} ({}, {} tensors): the other run on quantized weights, for the error split",
                colors.bold("quantized:"),
                quantized.path,
                quantized.writer,
                quantized.tensors
            );
        }
        if let (Some(floor), Some(factor)) = (self.floor, self.floor_factor) {
            let _ = writeln!(
                out,
                "{} {} ({}, {} tensors): each tensor's rtol is the larger of the given one and \
                 {factor} times the floor's error",
                colors.bold("floor:    "),
                floor.path,
                floor.writer,
                floor.tensors
            );
        }
        for (label, info) in [("reference", &self.reference), ("other", &self.other)] {
            if let Some(cut) = &info.cut_short {
                let _ = writeln!(out, "{}", colors.warn(&format!("{label} cut short: {cut}")));
            }
            if let Some(fed) = &info.isolate {
                let _ = writeln!(
                    out,
                    "{label} isolated: every layer was fed the inputs {fed} captured, so its \
                     errors are each layer's own"
                );
            } else if !info.interventions.is_empty() {
                let changes = crate::header::interventions_text(&info.interventions);
                let _ = writeln!(
                    out,
                    "{}",
                    colors.warn(&format!("{label} changed by: {changes}"))
                );
            }
        }
    }

    /// How many matched tensors had each verdict, and those only one trace has.
    fn counts(&self, out: &mut String, colors: &Colors) {
        let c = &self.compared;
        let _ = writeln!(
            out,
            "{} {} tensors: {} bit-identical, {} close, {} diverged, {} of another shape",
            colors.bold("matched:"),
            c.matched,
            c.bit_identical,
            c.close,
            if c.diverged > 0 {
                colors.bad(&c.diverged.to_string())
            } else {
                c.diverged.to_string()
            },
            if c.shape_mismatch > 0 {
                colors.bad(&c.shape_mismatch.to_string())
            } else {
                c.shape_mismatch.to_string()
            },
        );
        unmatched(
            out,
            colors,
            "only in the reference",
            self.missing,
            self.missing_count,
        );
        unmatched(
            out,
            colors,
            "only in the other",
            self.extra,
            self.extra_count,
        );
    }

    /// The tensors the floor set no tolerance for or measured unlike, then the warnings of
    /// reading and comparing (the others go to stderr).
    fn warnings(&self, out: &mut String, colors: &Colors) {
        listed(
            out,
            colors,
            &format!(
                "warning: {} compared tensors have no floor, judged by the given rtol:",
                self.no_floor_count
            ),
            (self.no_floor.iter())
                .map(|n| format!("{} ({})", n.tensor.describe(), n.why.describe())),
            self.no_floor_count,
        );
        listed(
            out,
            colors,
            &format!("warning: {}:", unlike_text(self.unlike_floor)),
            self.unlike_floor.items.iter().map(TensorKey::describe),
            self.unlike_floor.count,
        );
        for warning in &self.warnings[..self.listed_read_warnings] {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        if self.read_warnings > self.listed_read_warnings {
            let _ = writeln!(
                out,
                "{}",
                colors.warn(&format!(
                    "... and {} more warnings",
                    self.read_warnings - self.listed_read_warnings
                ))
            );
        }
    }

    /// The first divergence (or none), then the first pass where the runs chose other tokens
    /// (or that they chose the same).
    fn first_divergences(&self, out: &mut String, colors: &Colors) {
        let routing = self.routing.and_then(|routing| routing.headline());
        match (&self.first_divergence, &routing) {
            (None, None) => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good("no divergence: every matched tensor is within tolerance")
                );
            }
            (None, Some(_)) => {
                let _ = writeln!(
                    out,
                    "no tensor divergence: every matched tensor is within tolerance"
                );
            }
            (Some(d), _) => {
                describe(out, colors, d, self.tolerance, self.floor_factor);
                self.weights_hint(out, d);
            }
        }
        if let Some(routing) = routing {
            let _ = writeln!(out, "{}", colors.bad(&routing));
        }
        if let Some(tokens) = self.first_token_divergence {
            let text = tokens.text();
            let _ = write!(
                out,
                "{}",
                match tokens.verdict {
                    TokenVerdict::NearTie => text,
                    _ => colors.bad(&text),
                }
            );
        } else if self.token_passes_compared > 1 {
            let _ = writeln!(
                out,
                "same tokens: both runs chose the same next token in all {} passes compared",
                self.token_passes_compared
            );
        }
    }

    /// Under a tolerance for the same float weights, values that differ in layer 0 or at the
    /// first tensor compared may say more of the weights than of the code (a shape that
    /// differs says nothing of them).
    fn weights_hint(&self, out: &mut String, d: &Divergence<'_>) {
        let start = d.layer == 0 || d.first_compared;
        let values = d.detail.pair.verdict == Verdict::Diverged;
        if self.tolerance_choice.assumes_same_weights() && start && values {
            let _ = writeln!(
                out,
                "  hint: the tolerance assumes both runs computed on the same float weights, and \
                 they part at the start: the weights may not be the same (another file, another \
                 dequantization, a norm's +1 folded in or not), or a kernel of one side rounds \
                 where the other's does not"
            );
        }
    }

    fn layer_table(&self, out: &mut String, colors: &Colors) {
        let diverged_passes = self.passes.iter().filter(|p| p.diverged > 0).count();
        if self.passes.len() > 1 {
            let _ = writeln!(
                out,
                "{} passes, {} with a divergence; the table is pass {} (--pass N for another)",
                self.passes.len(),
                diverged_passes,
                self.table_pass
            );
        }
        if self.floor_factor.is_some() {
            self.floor_table(out, colors);
            return;
        }
        let _ = writeln!(
            out,
            "{}",
            colors.bold("layer  worst tensor      ratio      rel. error    verdict")
        );
        for row in &self.layers {
            let pair = &row.worst.pair;
            let error = pair.error.relative_error.map_or_else(
                || "-".to_owned(),
                |e| format!("{}{e:.2e}", estimated(pair.error.exact)),
            );
            let _ = writeln!(
                out,
                "{:>5}  {:<16}  {:>9}  {:>12}    {}",
                row.layer,
                with_shard(&pair.name, pair.shard),
                ratio_text(row.ratio),
                error,
                verdict_text(colors, pair.verdict)
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim("(ratio: the largest difference over what the tolerance allows, above 1 out of tolerance; rel. error ‖b − a‖/‖a‖, ≈ when estimated from the sketches)")
        );
    }

    /// The per-layer table with a floor: each layer's worst tensor, the floor's error and the
    /// other's (the smallest rtol at which each is close to the reference), their ratio, and
    /// the rtol allowed.
    fn floor_table(&self, out: &mut String, colors: &Colors) {
        let line = |cells: [&str; 7], verdict: &str| {
            format!(
                "{:>5}  {:<16}  {:>9}  {:>10}  {:>10}  {:>11}  {:>12}    {verdict}",
                cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]
            )
        };
        let head = [
            "layer",
            "worst tensor",
            "ratio",
            "floor rtol",
            "other rtol",
            "other/floor",
            "allowed rtol",
        ];
        let _ = writeln!(out, "{}", colors.bold(&line(head, "verdict")));
        for row in &self.layers {
            let (judged, pair) = (row.worst, &row.worst.pair);
            let floor = match (judged.floor_rtol, judged.no_floor) {
                (Some(rtol), _) => rtol_text(Some(rtol), judged.floor_exact == Some(true)),
                (None, Some(_)) => "none".to_owned(),
                (None, None) => "-".to_owned(),
            };
            let other = match pair.verdict {
                Verdict::ShapeMismatch => "-".to_owned(),
                _ => rtol_text(pair.least_rtol, pair.error.exact),
            };
            let cells = [
                &row.layer.to_string(),
                &with_shard(&pair.name, pair.shard),
                &ratio_text(row.ratio),
                &floor,
                &other,
                &judged
                    .floor_ratio()
                    .map_or_else(|| "-".to_owned(), ratio_text),
                &format!("{:.2e}", pair.tolerance.rtol),
            ];
            let _ = writeln!(
                out,
                "{}",
                line(
                    cells.map(String::as_str),
                    &verdict_text(colors, pair.verdict)
                )
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim(
                "(floor rtol, other rtol: the smallest rtol at which the floor, the other, is \
                 close to the reference for that tensor, ≈ where summaries bound it; allowed \
                 rtol: the larger of the given and the floor factor times the floor's (none: \
                 no floor for it); ratio: the largest difference over what that allows)"
            )
        );
    }
}

/// The tolerance line: the default atol and rtol, the per-name overrides, the criterion.
fn tolerance(out: &mut String, colors: &Colors, t: &Tolerances) {
    let mut overrides = Vec::new();
    overrides.extend(
        t.atol_overrides
            .iter()
            .map(|(n, v)| format!("atol {v:e} for {n}")),
    );
    overrides.extend(
        t.rtol_overrides
            .iter()
            .map(|(n, v)| format!("rtol {v:e} for {n}")),
    );
    let stat_overrides: Vec<String> = t
        .error_stat_overrides
        .iter()
        .map(|(n, stat)| format!("{stat} for {n}"))
        .collect();
    let _ = writeln!(
        out,
        "{} atol {}, rtol {}{}; {} criterion{}",
        colors.bold("tolerance:"),
        tolerance_number(t.default.atol),
        tolerance_number(t.default.rtol),
        parenthesized(&overrides),
        t.error_stat,
        parenthesized(&stat_overrides)
    );
}

/// Under the tolerance line: where it came from and why, and what it does not cover.
fn tolerance_choice(out: &mut String, choice: &ToleranceChoice) {
    let source = match choice.rule {
        ToleranceRule::SameFloatWeights
        | ToleranceRule::SameFloatWeightsLlamaCpp
        | ToleranceRule::Quantized => "chosen from the headers: ",
        // The reason says it is the built-in default, or that it was given.
        _ => "",
    };
    let _ = writeln!(out, "  {source}{}", choice.reason);
    if let Some(note) = choice.note {
        let _ = writeln!(out, "  note: {note}");
    }
}

/// `≈` for an estimate, nothing for an exact value.
fn estimated(exact: bool) -> &'static str {
    if exact {
        ""
    } else {
        "≈"
    }
}

/// A least rtol: `1.23e-3`, `≈1.23e-3` from summaries, `∞` where no rtol is enough.
fn rtol_text(rtol: Option<f64>, exact: bool) -> String {
    rtol.map_or_else(
        || "∞".to_owned(),
        |r| format!("{}{r:.2e}", estimated(exact)),
    )
}

fn verdict_text(colors: &Colors, verdict: Verdict) -> String {
    match verdict {
        Verdict::BitIdentical => colors.dim("bit-identical"),
        Verdict::Close => colors.good("close"),
        Verdict::Diverged => colors.bad("diverged"),
        Verdict::ShapeMismatch => colors.bad("shape mismatch"),
    }
}

/// ` (a, b)`, or nothing for no items.
fn parenthesized(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" ({})", items.join(", "))
    }
}

/// The first divergence; `tolerances` are the ones given (a tensor judged by another criterion
/// than their default says so), `floor_factor` the floor's factor where a floor set the rtol.
fn describe(
    out: &mut String,
    colors: &Colors,
    d: &Divergence<'_>,
    tolerances: &Tolerances,
    floor_factor: Option<f64>,
) {
    let p = &d.detail.pair;
    divergence_place(out, colors, d);
    if p.verdict == Verdict::ShapeMismatch {
        let _ = writeln!(
            out,
            "  shapes differ: reference {:?}, other {:?}",
            p.shapes.0, p.shapes.1
        );
        return;
    }
    let _ = writeln!(
        out,
        "  shape {:?}; tolerance atol {}, rtol {}{}; compared {}",
        p.shapes.0,
        tolerance_number(p.tolerance.atol),
        number_text(p.tolerance.rtol),
        if p.error_stat == tolerances.error_stat {
            String::new()
        } else {
            format!(", {} criterion", p.error_stat)
        },
        if p.method == "elementwise" {
            "value by value (both captured)".to_owned()
        } else {
            summaries_compared(&p.checks)
        }
    );
    if let Some(factor) = floor_factor {
        floor_said(out, d.detail, tolerances, factor);
    }
    failing_checks(out, &p.checks);
    error_measures(out, &p.error);
}

/// Where the first divergence is: its pass, layer and stage, or before the first layer.
fn divergence_place(out: &mut String, colors: &Colors, d: &Divergence<'_>) {
    let shard = d.detail.pair.shard;
    if d.before_first_layer {
        let _ = writeln!(
            out,
            "{} pass {}, {} (layer 0, {}; seq {} of the reference)",
            colors.bad("first divergence:"),
            d.pass,
            colors.bold("before the first layer: the embeddings"),
            with_shard(d.stage, shard),
            d.seq
        );
        let _ = writeln!(
            out,
            "  layer 0's input is the embeddings as the model scales them: no layer computed \
             it, so look at the embedding lookup and its scaling; every layer after it \
             inherits the difference"
        );
    } else {
        let _ = writeln!(
            out,
            "{} pass {}, layer {}, {} (seq {} of the reference)",
            colors.bad("first divergence:"),
            d.pass,
            d.layer,
            colors.bold(&with_shard(d.stage, shard)),
            d.seq
        );
    }
}

/// The first [`SHOWN_CHECKS`] checks out of tolerance, what each compared, then how many more.
fn failing_checks(out: &mut String, checks: &[Check]) {
    for check in checks.iter().filter(|c| c.ratio() > 1.0).take(SHOWN_CHECKS) {
        if check.what.starts_with("elements") {
            let _ = writeln!(
                out,
                "  {}: {:.3} times what the tolerance allows",
                check.what, check.difference
            );
        } else {
            let _ = writeln!(
                out,
                "  {:<12} reference {:<14} other {:<14} differs by {:.3e}, allowed {:.3e} ({})",
                check.what,
                format!("{:.6e}", check.reference),
                format!("{:.6e}", check.other),
                check.difference,
                check.allowed,
                ratio_text(check.ratio())
            );
        }
    }
    let failing = checks.iter().filter(|c| c.ratio() > 1.0).count();
    if failing > SHOWN_CHECKS {
        let _ = writeln!(
            out,
            "  ... and {} more checks out of tolerance",
            failing - SHOWN_CHECKS
        );
    }
}

/// The error measures of a compared tensor, those it has, in a line.
fn error_measures(out: &mut String, e: &ErrorMeasure) {
    let mut measures = Vec::new();
    if let Some(rel) = e.relative_error {
        measures.push(format!(
            "relative error {}{rel:.3e}",
            if e.exact { "" } else { "≈ " }
        ));
    }
    if let Some(v) = e.max_abs_error {
        measures.push(format!("max abs error {v:.3e}"));
    }
    if let Some(v) = e.max_rel_error {
        measures.push(format!("max rel error {v:.3e}"));
    }
    if let Some(v) = e.cosine {
        measures.push(format!("cosine {v:.6}"));
    }
    if let Some(v) = e.nmse_db {
        measures.push(format!("NMSE {v:.1} dB"));
    }
    if let Some((bad, all)) = e.mismatched {
        measures.push(format!("{bad} of {all} elements out of tolerance"));
    }
    if !measures.is_empty() {
        let _ = writeln!(out, "  {}", measures.join(", "));
    }
}

/// Where the rtol of `judged` came from, and its error against the floor's.
fn floor_said(out: &mut String, judged: &TensorJudgement, tolerances: &Tolerances, factor: f64) {
    let p = &judged.pair;
    let given = tolerances.for_name(&full_name(p.layer, &p.name)).rtol;
    let other = rtol_text(p.least_rtol, p.error.exact);
    let _ = match (judged.floor_rtol, judged.no_floor) {
        (Some(floor), _) => {
            let floor_error = format!(
                "{factor} times the floor's error {}",
                rtol_text(Some(floor), judged.floor_exact == Some(true))
            );
            let source = if p.tolerance.rtol > given {
                format!("is {floor_error} (more than the given {given:e})")
            } else {
                format!("as given (more than {floor_error})")
            };
            let ratio = judged.floor_ratio().map_or_else(|| "-".to_owned(), ratio_text);
            writeln!(
                out,
                "  rtol {} {source}; the other's error is {other}, {} times the floor's",
                number_text(p.tolerance.rtol),
                ratio.trim_end_matches('x')
            )
        }
        (None, why) => writeln!(
            out,
            "  rtol {given:e} as given: no floor for this tensor ({}); the other's error is {other}",
            why.map_or("none", NoFloor::describe)
        ),
    };
}

/// `1e-5` as given, `1.993e-3` for a number of many digits.
fn number_text(value: f64) -> String {
    let (all, short) = (format!("{value:e}"), format!("{value:.3e}"));
    if all.len() <= short.len() {
        all
    } else {
        short
    }
}

fn unmatched(out: &mut String, colors: &Colors, label: &str, list: &[Unmatched], count: usize) {
    let items = list.iter().map(Unmatched::describe);
    listed(out, colors, &format!("{count} {label}:"), items, count);
}

/// `label` and the first [`SHOWN_UNMATCHED`] of `count` items, then how many more; nothing
/// when there are none.
fn listed(
    out: &mut String,
    colors: &Colors,
    label: &str,
    items: impl Iterator<Item = String>,
    count: usize,
) {
    if count == 0 {
        return;
    }
    let shown: Vec<String> = items.take(SHOWN_UNMATCHED).collect();
    let more = count.saturating_sub(shown.len());
    let _ = writeln!(
        out,
        "{} {}{}",
        colors.warn(label),
        shown.join(", "),
        if more > 0 {
            format!(", ... and {more} more")
        } else {
            String::new()
        }
    );
}

/// `attn_out`, or `attn_out (rank 1's shard)`.
fn with_shard(name: &str, shard: Option<usize>) -> String {
    match shard {
        Some(rank) => format!("{name} (rank {rank}'s shard)"),
        None => name.to_owned(),
    }
}

/// The ratio of a pair for tables: 0 for bit-identical, infinite for a shape mismatch.
pub(crate) fn ratio_text(ratio: f64) -> String {
    if ratio.is_infinite() {
        "∞".to_owned()
    } else if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.3}")
    }
}

/// `by summaries (statistics, sketch, samples)`, naming only what both summaries had (a golden
/// file keeps statistics alone).
fn summaries_compared(checks: &[Check]) -> String {
    let had = |prefix: &str| checks.iter().any(|c| c.what.starts_with(prefix));
    let mut parts = vec!["statistics"];
    if had("sketch") {
        parts.push("sketch");
    }
    if had("head") || had("tail") {
        parts.push("samples");
    }
    format!("by summaries ({})", parts.join(", "))
}

/// A tolerance as the text prints it: `1e-4`, and `0` for none (not `0e0`).
fn tolerance_number(value: f64) -> String {
    if value == 0.0 {
        "0".to_owned()
    } else {
        format!("{value:e}")
    }
}
