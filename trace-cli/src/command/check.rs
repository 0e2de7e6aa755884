//! `model-trace check FILE...`: whether each layer's stages obey the identities their names
//! promise (`docs/trace-format.md`, "The stage check").

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;
use trace_runtime::stage_check::{
    KindTally, Located, Skip, StageCheckTally, SKETCH_TOLERANCE, VALUES_TOLERANCE,
};

use crate::command::Outcome;
use crate::input::{self, InputError, TraceRun};
use crate::stage_check::{FailureView, StageChecker};
use crate::style::Colors;

/// Failures listed in the text output before "... and N more".
const SHOWN_FAILURES: usize = 10;

pub(crate) fn run(paths: &[PathBuf], json: bool, colors: &Colors) -> Result<Outcome, InputError> {
    let run = TraceRun::open(paths)?;
    run.warn_missing_ranks();
    let mut checker = StageChecker::new(&run)?;
    let notes = input::read(&run, |file, event| checker.event(&run, file, &event))?;
    if checker.tally.layers == 0 {
        return Err(format!(
            "{}: no layer records to check (the stage check reads the stages of `layer` events)",
            run.label
        ));
    }
    let report = Report::new(&run, &checker, notes.truncation());
    if json {
        crate::output::emit_json(&report)?;
    } else {
        crate::output::emit(&report.text(colors))?;
    }
    Ok(if checker.tally.passed() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}

/// What `check` reports, as text or JSON.
#[derive(Debug, Serialize)]
struct Report<'a> {
    trace: Trace,
    /// The residual multiplier `r` (the header's `metadata.extra.residual_multiplier`, else 1).
    residual_multiplier: f64,
    tolerance: Tolerance,
    /// Passes with a layer record.
    passes: usize,
    /// Layer records checked (per rank, in a run of several).
    layers: usize,
    /// Per identity that applied to some layer, in the order R1, R2, R3, N1 ... N4.
    identities: Vec<IdentityRow<'a>>,
    /// The failures in the order read: the first 1000.
    failures: Vec<FailureView>,
    /// How many identities failed in all.
    failure_count: usize,
    /// No identity failed.
    passed: bool,
    /// Captures that could not be read (those identities were checked through the sketches),
    /// a last line cut short.
    warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Trace {
    path: String,
    writer: String,
    /// The rank files read together, for a run of several ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<usize>,
}

#[derive(Debug, Serialize)]
struct Tolerance {
    /// On captured values.
    values: f64,
    /// Estimated from the sketches.
    sketch: f64,
}

#[derive(Debug, Serialize)]
struct IdentityRow<'a> {
    /// `R1` ... `N4`.
    identity: &'static str,
    /// Its general form: `resid_mid = input + r·A`.
    form: &'static str,
    /// Layers that passed (`passed_post_norm` of them in the post-norm form), failed, were
    /// skipped (by reason: `needs_captures`, `few_rows`, `not_comparable`, `no_sketch`,
    /// `non_finite`).
    #[serde(flatten)]
    tally: &'a KindTally,
}

impl<'a> Report<'a> {
    fn new(run: &TraceRun, checker: &'a StageChecker, cut_short: Option<String>) -> Self {
        let tally: &StageCheckTally = &checker.tally;
        let mut warnings = checker.warnings.clone();
        if checker.warning_count > checker.warnings.len() {
            warnings.push(format!(
                "... and {} more captures that could not be read",
                checker.warning_count - checker.warnings.len()
            ));
        }
        warnings.extend(cut_short);
        Self {
            trace: Trace {
                path: run.label.clone(),
                writer: run.header().writer.clone(),
                ranks: run.is_ranked().then_some(run.files.len()),
            },
            residual_multiplier: checker.multiplier(),
            tolerance: Tolerance {
                values: VALUES_TOLERANCE,
                sketch: SKETCH_TOLERANCE,
            },
            passes: checker.passes.len(),
            layers: tally.layers,
            identities: (tally.identities.iter())
                .map(|(kind, tally)| IdentityRow {
                    identity: kind.code(),
                    form: kind.form(),
                    tally,
                })
                .collect(),
            failures: tally.failures.iter().map(FailureView::new).collect(),
            failure_count: tally.failure_count,
            passed: tally.passed(),
            warnings,
        }
    }

    fn text(&self, colors: &Colors) -> String {
        let mut out = String::new();
        let ranks = self
            .trace
            .ranks
            .map_or_else(String::new, |n| format!(", {n} rank files"));
        let _ = writeln!(
            out,
            "{} {} ({}{ranks}): {} {}, {} layer records",
            colors.bold("trace:"),
            self.trace.path,
            self.trace.writer,
            self.passes,
            if self.passes == 1 { "pass" } else { "passes" },
            self.layers
        );
        let multiplier = if self.residual_multiplier == 1.0 {
            String::new()
        } else {
            format!("; residual multiplier r = {}", self.residual_multiplier)
        };
        let _ = writeln!(
            out,
            "{} relative error {:.0e} on captured values, {:.0e} estimated from sketches{multiplier}",
            colors.bold("tolerance:"),
            self.tolerance.values,
            self.tolerance.sketch
        );
        for warning in &self.warnings {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        let _ = writeln!(out);
        if self.identities.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                colors.warn(
                    "no identity applies: no layer records the stages of one (resid_mid, \
                     attn_out or attn_post_norm, mlp_out or mlp_post_norm, attn_in, mlp_in \
                     beside input and output)"
                )
            );
            return out;
        }
        self.table(&mut out, colors);
        let _ = writeln!(out);
        self.verdict(&mut out, colors);
        out
    }

    fn table(&self, out: &mut String, colors: &Colors) {
        let _ = writeln!(
            out,
            "{}",
            colors.bold(&format!(
                "{:<40} {:>7} {:>7} {:>8}   {:<28} {}",
                "identity", "passed", "failed", "skipped", "largest error: values", "sketch"
            ))
        );
        for row in &self.identities {
            let t = row.tally;
            let failed = if t.failed > 0 {
                colors.bad(&format!("{:>7}", t.failed))
            } else {
                format!("{:>7}", t.failed)
            };
            let _ = writeln!(
                out,
                "{:<40} {:>7} {failed} {:>8}   {:<28} {}",
                format!("{} {}", row.identity, row.form),
                t.passed,
                t.skipped_count(),
                error_text(t.largest_values_error.as_ref(), ""),
                error_text(t.largest_sketch_error.as_ref(), "≈"),
            );
        }
        let skipped: Vec<String> = (self.identities.iter())
            .filter(|row| row.tally.skipped_count() > 0)
            .map(|row| {
                let reasons: Vec<String> = Skip::ALL
                    .iter()
                    .filter_map(|skip| {
                        let n = row.tally.skipped.get(skip)?;
                        Some(format!("{n} ({})", skip.describe()))
                    })
                    .collect();
                format!("{}: {}", row.identity, reasons.join(", "))
            })
            .collect();
        let post_norm: Vec<String> = (self.identities.iter())
            .filter(|row| row.tally.passed_post_norm > 0)
            .map(|row| format!("{} {}", row.identity, row.tally.passed_post_norm))
            .collect();
        if !post_norm.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                colors.dim(&format!(
                    "passed in the post-norm form lhs ≈ norm(rhs) (a block with no norm stage \
                     of its own, BERT's): {}",
                    post_norm.join(", ")
                ))
            );
        }
        if !skipped.is_empty() {
            let _ = writeln!(
                out,
                "{}",
                colors.dim(&format!("skipped: {}", skipped.join("; ")))
            );
        }
        let _ = writeln!(
            out,
            "{}",
            colors.dim(
                "(A: attn_post_norm where recorded, else attn_out; M: mlp_post_norm, else \
                 mlp_out; error ‖lhs − rhs‖/‖lhs‖, ≈ estimated from the sketches; a post-norm \
                 block's identities hold as lhs ≈ norm(rhs); norm identities need captures and \
                 4 rows)"
            )
        );
    }

    fn verdict(&self, out: &mut String, colors: &Colors) {
        if self.passed {
            let decided: usize = (self.identities.iter()).map(|row| row.tally.passed).sum();
            if decided == 0 {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.warn(
                        "no identity could be decided (see skipped): capture the trace \
                         (MODEL_TRACE_CAPTURE, the examples' --capture pass=0) to check it"
                    )
                );
            } else {
                let _ = writeln!(
                    out,
                    "{}",
                    colors.good(&format!(
                        "every identity checked holds ({decided} in all): the stages mean what \
                         their names say"
                    ))
                );
            }
            return;
        }
        let _ = writeln!(
            out,
            "{} {} identities fail: these stages do not mean what their names say (a stage \
             recorded on the wrong line, or a stage map of another family)",
            colors.bad("stage check failed:"),
            self.failure_count
        );
        for failure in self.failures.iter().take(SHOWN_FAILURES) {
            let _ = writeln!(out, "  {}", failure.text);
        }
        if self.failure_count > SHOWN_FAILURES {
            let _ = writeln!(
                out,
                "  ... and {} more (--json lists the first {})",
                self.failure_count - SHOWN_FAILURES,
                StageCheckTally::LISTED
            );
        }
    }
}

/// `1.23e-7 (pass 0, layer 3)`, `≈` for an estimate; `-` where none was measured.
fn error_text(located: Option<&Located>, estimate: &str) -> String {
    located.map_or_else(
        || "-".to_owned(),
        |l| {
            let rank = l.rank.map_or_else(String::new, |r| format!(", rank {r}"));
            format!(
                "{estimate}{:.2e} (pass {}, layer {}{rank})",
                l.error, l.pass, l.layer
            )
        },
    )
}
