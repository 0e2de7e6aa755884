//! Two traces read and compared, and what that comparison reports (as text or JSON): what
//! `diff` prints, and what `report --against` puts on its page.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use trace_runtime::compare::{
    compare, CompareOptions, Comparison, ErrorStat, TensorComparison, TraceTensors, TracedTensor,
    Unmatched, Verdict,
};
use trace_runtime::{read_capture, CaptureError};

use crate::load::{self, InputError};
use crate::style::Colors;

/// Unmatched tensors listed in the text output before "... and N more".
const SHOWN_UNMATCHED: usize = 8;

/// Two traces read and compared.
pub(crate) struct Diffed {
    pub(crate) comparison: Comparison,
    options: CompareOptions,
    files: [FileInfo; 2],
}

impl Diffed {
    /// Reads both files (one per core) and compares them, reading captured tensors where
    /// `options` says to.
    pub(crate) fn read(
        reference: &Path,
        other: &Path,
        options: CompareOptions,
    ) -> Result<Self, InputError> {
        let (ref_tensors, other_tensors) = std::thread::scope(|scope| {
            let read_other = scope.spawn(|| tensors(other));
            let ref_tensors = tensors(reference);
            let other_tensors = read_other
                .join()
                .unwrap_or_else(|_| Err("reading the second file failed".to_owned()));
            (ref_tensors, other_tensors)
        });
        let ((ref_tensors, ref_notes), (other_tensors, other_notes)) =
            (ref_tensors?, other_tensors?);
        if ref_tensors.tensors.is_empty() {
            return Err(format!(
                "{}: no tensors to compare (no layer, attention or logits events)",
                reference.display()
            ));
        }
        let comparison = compare(&ref_tensors, &other_tensors, &options, captured);
        if comparison.pairs.is_empty() {
            return Err(format!(
                "no tensor of {} matches one of {} by (pass, layer, name); the names differ? \
                 (--map llama|bert|FILE renames them)",
                other.display(),
                reference.display()
            ));
        }
        let info = |path: &Path, trace: &TraceTensors, notes: load::ReadNotes| FileInfo {
            path: path.display().to_string(),
            writer: trace.header.writer.clone(),
            tensors: trace.tensors.len(),
            cut_short: notes.truncated,
        };
        Ok(Self {
            files: [
                info(reference, &ref_tensors, ref_notes),
                info(other, &other_tensors, other_notes),
            ],
            comparison,
            options,
        })
    }

    /// What to report; the per-layer table is about `pass` (default: the first divergence's,
    /// else the one with the largest error).
    pub(crate) fn report(&self, pass: Option<usize>) -> Report<'_> {
        Report::new(&self.files, &self.comparison, &self.options, pass)
    }

    /// Whether a tensor diverged.
    pub(crate) fn diverged(&self) -> bool {
        self.comparison.first_divergence().is_some()
    }

    /// Says on stderr which per-name overrides matched no tensor (the JSON output has them
    /// among its `warnings`).
    pub(crate) fn warn_unused_overrides(&self) {
        for unused in &self.comparison.unused_overrides {
            eprintln!("model-trace: warning: {unused}");
        }
    }
}

/// The values of a captured tensor of a trace on disk, read from beside the trace.
fn captured(trace: &TraceTensors, tensor: &TracedTensor) -> Option<Result<Vec<f32>, CaptureError>> {
    let capture = tensor.tensor.capture.as_ref()?;
    let path = trace.path.as_ref()?;
    Some(read_capture(path, capture).map(|(_, values)| values))
}

/// The tensors of a file, each event reduced to them as it is read.
fn tensors(path: &Path) -> Result<(TraceTensors, load::ReadNotes), InputError> {
    let mut tensors: Option<TraceTensors> = None;
    let (header, notes) = load::read(path, |header, event| {
        tensors
            .get_or_insert_with(|| TraceTensors::new(header.clone(), Some(path)))
            .push(event);
    })?;
    let tensors = tensors.unwrap_or_else(|| TraceTensors::new(header, Some(path)));
    Ok((tensors.finish(), notes))
}

/// What `diff` reports, as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct Report<'a> {
    reference: &'a FileInfo,
    other: &'a FileInfo,
    tolerance: &'a trace_runtime::compare::Tolerances,
    compared: Counts,
    /// `{pass, layer, stage}` of the first divergence in the reference's execution order, with
    /// what differs there; `null` when nothing diverged.
    pub(crate) first_divergence: Option<Divergence<'a>>,
    /// The pass the per-layer table is about.
    pub(crate) table_pass: usize,
    /// Per layer of that pass: the worst tensor.
    layers: Vec<LayerRow<'a>>,
    /// Per pass: the worst ratio and how many tensors diverged.
    pub(crate) passes: Vec<PassRow>,
    missing: &'a [Unmatched],
    extra: &'a [Unmatched],
    /// Captures that could not be read, then per-name overrides that matched no tensor.
    warnings: Vec<String>,
    /// How many of `warnings` are about captures: the text shows those (the others go to
    /// stderr).
    #[serde(skip)]
    capture_warnings: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct FileInfo {
    path: String,
    writer: String,
    tensors: usize,
    cut_short: Option<String>,
}

#[derive(Debug, Serialize)]
struct Counts {
    matched: usize,
    bit_identical: usize,
    close: usize,
    diverged: usize,
    shape_mismatch: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct Divergence<'a> {
    pub(crate) pass: usize,
    pub(crate) layer: usize,
    pub(crate) stage: &'a str,
    seq: u64,
    #[serde(flatten)]
    detail: &'a TensorComparison,
}

#[derive(Debug, Serialize)]
struct LayerRow<'a> {
    layer: usize,
    worst: &'a TensorComparison,
    ratio: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct PassRow {
    pub(crate) pass: usize,
    pub(crate) worst_ratio: f64,
    pub(crate) diverged: usize,
}

impl<'a> Report<'a> {
    fn new(
        files: &'a [FileInfo; 2],
        comparison: &'a Comparison,
        options: &'a CompareOptions,
        pass: Option<usize>,
    ) -> Self {
        let first = comparison.first_divergence();
        let mut passes: BTreeMap<usize, PassRow> = BTreeMap::new();
        for pair in &comparison.pairs {
            let row = passes.entry(pair.pass).or_insert(PassRow {
                pass: pair.pass,
                worst_ratio: 0.0,
                diverged: 0,
            });
            row.worst_ratio = row.worst_ratio.max(ratio(pair));
            row.diverged += usize::from(pair.verdict.is_divergence());
        }
        let table_pass = pass
            .or_else(|| first.map(|f| f.pass))
            .or_else(|| {
                passes
                    .values()
                    .max_by(|a, b| a.worst_ratio.total_cmp(&b.worst_ratio))
                    .map(|p| p.pass)
            })
            .unwrap_or(0);
        let mut layers: BTreeMap<usize, LayerRow<'a>> = BTreeMap::new();
        for pair in comparison.pairs.iter().filter(|p| p.pass == table_pass) {
            let r = ratio(pair);
            let row = layers.entry(pair.layer).or_insert(LayerRow {
                layer: pair.layer,
                worst: pair,
                ratio: r,
            });
            if r > row.ratio {
                row.worst = pair;
                row.ratio = r;
            }
        }
        Report {
            reference: &files[0],
            other: &files[1],
            tolerance: &options.tolerances,
            compared: Counts {
                matched: comparison.pairs.len(),
                bit_identical: comparison.count(Verdict::BitIdentical),
                close: comparison.count(Verdict::Close),
                diverged: comparison.count(Verdict::Diverged),
                shape_mismatch: comparison.count(Verdict::ShapeMismatch),
            },
            first_divergence: first.map(|f| Divergence {
                pass: f.pass,
                layer: f.layer,
                stage: &f.name,
                seq: f.seq,
                detail: f,
            }),
            table_pass,
            layers: layers.into_values().collect(),
            passes: passes.into_values().collect(),
            missing: &comparison.missing,
            extra: &comparison.extra,
            warnings: (comparison.warnings.iter().cloned())
                .chain(comparison.unused_overrides.iter().map(ToString::to_string))
                .collect(),
            capture_warnings: comparison.warnings.len(),
        }
    }

    pub(crate) fn text(&self, colors: &Colors) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {} ({}, {} tensors)",
            colors.bold("reference:"),
            self.reference.path,
            self.reference.writer,
            self.reference.tensors
        );
        let _ = writeln!(
            out,
            "{} {} ({}, {} tensors)",
            colors.bold("other:    "),
            self.other.path,
            self.other.writer,
            self.other.tensors
        );
        let t = self.tolerance;
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
            "{} atol {:e}, rtol {:e}{}; {} criterion{}",
            colors.bold("tolerance:"),
            t.default.atol,
            t.default.rtol,
            parenthesized(&overrides),
            t.error_stat,
            parenthesized(&stat_overrides)
        );
        for (label, info) in [("reference", &self.reference), ("other", &self.other)] {
            if let Some(cut) = &info.cut_short {
                let _ = writeln!(out, "{}", colors.warn(&format!("{label} cut short: {cut}")));
            }
        }
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
        unmatched(&mut out, colors, "only in the reference", self.missing);
        unmatched(&mut out, colors, "only in the other", self.extra);
        for warning in &self.warnings[..self.capture_warnings] {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        let _ = writeln!(out);
        match &self.first_divergence {
            None => {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good("no divergence: every matched tensor is within tolerance")
                );
            }
            Some(d) => describe(&mut out, colors, d, self.tolerance.error_stat),
        }
        let _ = writeln!(out);
        self.layer_table(&mut out, colors);
        out
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
        let _ = writeln!(
            out,
            "{}",
            colors.bold("layer  worst tensor      ratio      rel. error    verdict")
        );
        for row in &self.layers {
            let pair = row.worst;
            let error = pair.error.relative_error.map_or_else(
                || "-".to_owned(),
                |e| format!("{}{e:.2e}", if pair.error.exact { "" } else { "≈" }),
            );
            let verdict = match pair.verdict {
                Verdict::BitIdentical => colors.dim("bit-identical"),
                Verdict::Close => colors.good("close"),
                Verdict::Diverged => colors.bad("diverged"),
                Verdict::ShapeMismatch => colors.bad("shape mismatch"),
            };
            let _ = writeln!(
                out,
                "{:>5}  {:<16}  {:>9}  {:>12}    {verdict}",
                row.layer,
                pair.name,
                ratio_text(row.ratio),
                error
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim("(ratio: the largest difference over what the tolerance allows, above 1 out of tolerance; rel. error ‖b − a‖/‖a‖, ≈ when estimated from the sketches)")
        );
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

/// The first divergence; `error_stat` is the default criterion (a tensor judged by another
/// says so).
fn describe(out: &mut String, colors: &Colors, d: &Divergence<'_>, error_stat: ErrorStat) {
    let p = d.detail;
    let _ = writeln!(
        out,
        "{} pass {}, layer {}, {} (seq {} of the reference)",
        colors.bad("first divergence:"),
        d.pass,
        d.layer,
        colors.bold(d.stage),
        d.seq
    );
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
        "  shape {:?}; tolerance atol {:e}, rtol {:e}{}; compared {}",
        p.shapes.0,
        p.tolerance.atol,
        p.tolerance.rtol,
        if p.error_stat == error_stat {
            String::new()
        } else {
            format!(", {} criterion", p.error_stat)
        },
        if p.method == "elementwise" {
            "value by value (both captured)"
        } else {
            "by summaries (statistics, sketch, samples)"
        }
    );
    for check in p.checks.iter().filter(|c| c.ratio() > 1.0).take(6) {
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
    let failing = p.checks.iter().filter(|c| c.ratio() > 1.0).count();
    if failing > 6 {
        let _ = writeln!(
            out,
            "  ... and {} more checks out of tolerance",
            failing - 6
        );
    }
    let e = &p.error;
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

fn unmatched(out: &mut String, colors: &Colors, label: &str, list: &[Unmatched]) {
    if list.is_empty() {
        return;
    }
    let shown: Vec<String> = list
        .iter()
        .take(SHOWN_UNMATCHED)
        .map(|u| format!("pass {} layer.{}.{}", u.pass, u.layer, u.name))
        .collect();
    let more = list.len().saturating_sub(SHOWN_UNMATCHED);
    let _ = writeln!(
        out,
        "{} {}{}",
        colors.warn(&format!("{} {label}:", list.len())),
        shown.join(", "),
        if more > 0 {
            format!(", ... and {more} more")
        } else {
            String::new()
        }
    );
}

/// The ratio of a pair for tables: 0 for bit-identical, infinite for a shape mismatch.
fn ratio(pair: &TensorComparison) -> f64 {
    match pair.verdict {
        Verdict::ShapeMismatch => f64::INFINITY,
        _ => pair.worst_ratio(),
    }
}

fn ratio_text(ratio: f64) -> String {
    if ratio.is_infinite() {
        "∞".to_owned()
    } else if ratio >= 100.0 {
        format!("{ratio:.0}x")
    } else {
        format!("{ratio:.3}")
    }
}
