//! A trace's stage check, folded as its events are read: what `check` reports in full, and
//! what `diff` warns of when either trace fails it.

use std::collections::BTreeSet;

use serde::Serialize;
use trace_runtime::stage_check::{
    check_layer, residual_multiplier, Failure, Method, StageCheckTally,
};
use trace_runtime::{CaptureFiles, Event};

use crate::input::{InputError, TraceFile, TraceRun};

/// Warnings kept (captures that could not be read); the others are counted.
const LISTED_WARNINGS: usize = 100;

/// The stage check of one run, layer record by layer record.
pub(crate) struct StageChecker {
    /// Each file's residual multiplier, in the run's file order.
    multipliers: Vec<f64>,
    captures: CaptureFiles,
    pub(crate) tally: StageCheckTally,
    /// Captures that could not be read (the identity was then checked through the sketches):
    /// the first [`LISTED_WARNINGS`].
    pub(crate) warnings: Vec<String>,
    /// How many there were.
    pub(crate) warning_count: usize,
    /// The passes seen.
    pub(crate) passes: BTreeSet<usize>,
}

impl StageChecker {
    /// A check of `run`'s files; an error when a header's residual multiplier is not a number.
    pub(crate) fn new(run: &TraceRun) -> Result<Self, InputError> {
        let multipliers = (run.files.iter())
            .map(|file| {
                residual_multiplier(&file.header)
                    .map_err(|e| format!("{}: {e}", file.path.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            multipliers,
            captures: CaptureFiles::default(),
            tally: StageCheckTally::default(),
            warnings: Vec::new(),
            warning_count: 0,
            passes: BTreeSet::new(),
        })
    }

    /// The residual multiplier of the run's first file.
    pub(crate) fn multiplier(&self) -> f64 {
        self.multipliers.first().copied().unwrap_or(1.0)
    }

    /// Checks `event` if it is a layer record of `file` (one of `run`'s).
    pub(crate) fn event(&mut self, run: &TraceRun, file: &TraceFile, event: &Event) {
        let Event::Layer(layer) = event else {
            return;
        };
        self.passes.insert(layer.pass);
        let multiplier = (self.multipliers.get(run.index_of(file)).copied()).unwrap_or(1.0);
        let (captures, warnings, count) = (
            &mut self.captures,
            &mut self.warnings,
            &mut self.warning_count,
        );
        let checked = check_layer(layer, multiplier, |stage| {
            let capture = stage.tensor.capture.as_ref()?;
            match captures.read_capture(&file.path, capture) {
                Ok((_, values)) => Some(values),
                Err(error) => {
                    *count += 1;
                    if warnings.len() < LISTED_WARNINGS {
                        warnings.push(format!(
                            "{error}; layer {} {} checked by its summary instead",
                            layer.layer, stage.name
                        ));
                    }
                    None
                }
            }
        });
        self.tally.add(checked, file.header.rank);
    }

    /// What `diff` says of one side.
    pub(crate) fn verdict(&self) -> CheckVerdict {
        CheckVerdict {
            passed: self.tally.passed(),
            layers: self.tally.layers,
            decided: self.tally.decided(),
            failure_count: self.tally.failure_count,
            first_failure: self.tally.first_failure().map(FailureView::new),
            not_run: None,
        }
    }
}

/// The stage check of one trace, as `diff --json` gives it for each side (`stage_check`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckVerdict {
    /// No identity failed (also when none could be decided).
    pub(crate) passed: bool,
    /// Layer records checked.
    pub(crate) layers: usize,
    /// Identities decided (passed or failed).
    pub(crate) decided: usize,
    /// Identities that failed.
    pub(crate) failure_count: usize,
    /// The first that failed, in the order read.
    pub(crate) first_failure: Option<FailureView>,
    /// Why the check did not run (a residual multiplier that is not a number).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) not_run: Option<String>,
}

impl CheckVerdict {
    /// A check that could not run, and why.
    pub(crate) fn not_run(why: String) -> Self {
        Self {
            passed: true,
            layers: 0,
            decided: 0,
            failure_count: 0,
            first_failure: None,
            not_run: Some(why),
        }
    }

    /// The warning `diff` gives about the trace `label` (`the reference`, `the other`) at
    /// `path`, if it fails the check or the check could not run.
    pub(crate) fn warning(&self, label: &str, path: &str) -> Option<String> {
        if let Some(why) = &self.not_run {
            return Some(format!(
                "{label} ({path}): the stage check did not run: {why}"
            ));
        }
        let first = self.first_failure.as_ref()?;
        let more = match self.failure_count {
            1 => String::new(),
            n => format!(" ({n} identities fail in all)"),
        };
        Some(format!(
            "{label} ({path}) fails the stage check: {}{more}; its stages may not mean what \
             their names say, so a divergence below may be a wrong stage map rather than a \
             numeric error (`model-trace check {path}` lists every failure)",
            first.text
        ))
    }
}

/// A failed identity, for JSON and text.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FailureView {
    pub(crate) pass: usize,
    pub(crate) layer: usize,
    /// The rank whose record it is, in a run of several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rank: Option<usize>,
    /// `R1` ... `N4`.
    pub(crate) identity: &'static str,
    /// The identity with the layer's stages: `resid_mid = input + attn_out`.
    pub(crate) equation: String,
    /// `values` (captured) or `sketch` (estimated from the summaries).
    pub(crate) method: Option<Method>,
    /// The relative error (of the additive form).
    pub(crate) error: Option<f64>,
    /// The tolerance of the method.
    pub(crate) tolerance: f64,
    /// Where the post-norm form `lhs ≈ norm(rhs)` was tried (a layer with no norm stage of its
    /// own), its error; `null` otherwise.
    pub(crate) normalised_error: Option<f64>,
    /// All of it in a line.
    pub(crate) text: String,
}

impl FailureView {
    pub(crate) fn new(failure: &Failure) -> Self {
        let r = &failure.result;
        Self {
            pass: failure.pass,
            layer: failure.layer,
            rank: failure.rank,
            identity: r.identity.kind.code(),
            equation: r.identity.to_string(),
            method: r.method,
            error: r.error,
            tolerance: r.tolerance,
            normalised_error: r.normalised_error,
            text: failure.describe(),
        }
    }
}
