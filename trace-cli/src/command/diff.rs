//! `model-trace diff REFERENCE OTHER [--isolated ISOLATED]`: where OTHER starts to differ from
//! REFERENCE, and with an isolated run of OTHER, which layers are wrong on their own.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use trace_runtime::compare::TensorComparison;

use crate::args::DiffArgs;
use crate::command::Outcome;
use crate::comparison::{ratio_text, Diffed, Floor, Report};
use crate::input::InputError;
use crate::style::Colors;

pub(crate) fn run(args: &DiffArgs, colors: &Colors) -> Result<Outcome, InputError> {
    let options = args.compare.options()?;
    let floor = args.floor.floor.as_deref().map(|path| Floor {
        path,
        factor: args.floor.floor_factor,
    });
    let diffed = Diffed::read(
        &args.reference,
        &args.other,
        floor,
        options.clone(),
        args.pass,
    )?;
    diffed.warn_stage_check();
    let Some(isolated_path) = &args.isolated else {
        let report = diffed.report();
        if args.json {
            crate::output::emit_json(&report)?;
        } else {
            diffed.warn_unused_overrides();
            crate::output::emit(&report.text(colors))?;
        }
        return Ok(if diffed.diverged() {
            Outcome::Diverged
        } else {
            Outcome::Ok
        });
    };
    // The isolated run's table is about the same pass as the other's.
    let table_pass = Some(diffed.table_pass());
    // With a floor, the isolated run is judged by the same tolerances, tensor by tensor.
    let isolated = Diffed::read(&args.reference, isolated_path, floor, options, table_pass)?;
    if let Some(warning) = isolated.other_stage_check_warning("the isolated run") {
        eprintln!("model-trace: warning: {warning}");
    }
    let warning = fed_from_elsewhere(&args.reference, isolated_path, &isolated);
    let local = Local::new(&diffed, &isolated, warning);
    if args.json {
        crate::output::emit_json(&Combined {
            report: diffed.report(),
            isolated: isolated.report(),
            local: &local,
        })?;
    } else {
        diffed.warn_unused_overrides();
        let mut text = diffed.report().text(colors);
        local.text(&mut text, colors);
        crate::output::emit(&text)?;
    }
    Ok(if local.first_local_divergence.is_some() {
        Outcome::Diverged
    } else {
        Outcome::Ok
    })
}

/// What `diff --json --isolated` writes: the report of OTHER, the report of ISOLATED, and the
/// comparison of the two per layer.
#[derive(Serialize)]
struct Combined<'a> {
    #[serde(flatten)]
    report: Report<'a>,
    /// `diff REFERENCE ISOLATED`, as `diff` alone would write it.
    isolated: Report<'a>,
    #[serde(flatten)]
    local: &'a Local<'a>,
}

/// Each layer's error inherited (OTHER against the reference) and its own (ISOLATED against
/// the reference), in one pass.
#[derive(Serialize)]
struct Local<'a> {
    /// `{pass, layer, stage}` of the first tensor a layer computed out of tolerance when fed
    /// the reference's input, in the reference's execution order; `null`: every layer is
    /// within tolerance on its own.
    first_local_divergence: Option<Place<'a>>,
    /// The pass of the table.
    local_table_pass: usize,
    /// Per layer: the worst tensor of OTHER and of ISOLATED, and their ratios to the tolerance.
    local_layers: Vec<LocalRow<'a>>,
    /// The isolated run was fed another file than REFERENCE (said, not refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    isolation_warning: Option<String>,
    /// OTHER's first divergence is in the embeddings (layer 0's `input`, before the first
    /// layer): what diverges after it is inherited from them, not from a layer (the JSON has
    /// it as `first_divergence.before_first_layer`).
    #[serde(skip)]
    embeddings_diverged: bool,
}

#[derive(Serialize)]
struct Place<'a> {
    pass: usize,
    layer: usize,
    stage: &'a str,
    ratio: f64,
    relative_error: Option<f64>,
}

#[derive(Serialize)]
struct LocalRow<'a> {
    layer: usize,
    inherited: Option<Worst<'a>>,
    local: Option<Worst<'a>>,
}

#[derive(Serialize)]
struct Worst<'a> {
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

impl<'a> Worst<'a> {
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

impl<'a> Local<'a> {
    fn new(other: &'a Diffed, isolated: &'a Diffed, isolation_warning: Option<String>) -> Self {
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
            first_local_divergence: isolated.first().map(|pair| Place {
                pass: pair.pass,
                layer: pair.layer,
                stage: &pair.name,
                ratio: pair.ratio(),
                relative_error: pair.error.relative_error,
            }),
            local_table_pass: isolated.table_pass(),
            embeddings_diverged: other
                .first()
                .is_some_and(crate::comparison::before_first_layer),
            local_layers: layers
                .into_iter()
                .map(|layer| LocalRow {
                    layer,
                    inherited: inherited.get(&layer).copied().map(Worst::new),
                    local: local.get(&layer).copied().map(Worst::new),
                })
                .collect(),
            isolation_warning,
        }
    }

    fn text(&self, out: &mut String, colors: &Colors) {
        let _ = writeln!(out);
        if let Some(warning) = &self.isolation_warning {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
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
        let _ = writeln!(
            out,
            "{}",
            colors.bold(&format!(
                "layer  inherited (pass {})                local, isolated",
                self.local_table_pass
            ))
        );
        let cell = |worst: &Option<Worst<'_>>| match worst {
            None => format!("{:<31}", "-"),
            Some(w) => {
                let estimate = if w.exact { "" } else { "≈" };
                let error = w
                    .relative_error
                    .map_or_else(|| "-".to_owned(), |e| format!("{estimate}{e:.2e}"));
                format!("{:<12} {:>7} {:>10}", w.stage, ratio_text(w.ratio), error)
            }
        };
        for row in &self.local_layers {
            let own = row.local.as_ref().is_some_and(|w| w.ratio > 1.0);
            let undecided = row.local.as_ref().is_some_and(|w| w.undecided);
            let embeddings = self.embeddings_diverged && row.layer == 0;
            let verdict = if own {
                colors.bad("wrong on its own")
            } else if embeddings && row.inherited.as_ref().is_some_and(|w| w.ratio > 1.0) {
                colors.warn("from the embeddings (before the first layer)")
            } else if undecided {
                colors.warn("undecided: capture to tell")
            } else if row.inherited.as_ref().is_some_and(|w| w.ratio > 1.0) {
                colors.dim("inherited")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:>5}  {}   {}   {verdict}",
                row.layer,
                cell(&row.inherited),
                cell(&row.local)
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
}

/// A warning when the isolated run was fed another reference than the one compared with, or
/// is no isolated run at all.
fn fed_from_elsewhere(reference: &Path, isolated_path: &Path, isolated: &Diffed) -> Option<String> {
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
