//! `model-trace diff REFERENCE OTHER [--isolated ISOLATED]`: where OTHER starts to differ from
//! REFERENCE, and with an isolated run of OTHER, which layers are wrong on their own; by
//! position (`--by-position`, or by itself for traces with rows whose passes differ) and for a
//! batch against its prompts alone (`diff ALONE... --batch BATCH`), row by row.

use serde::Serialize;

use crate::args::DiffArgs;
use crate::command::Outcome;
use std::path::Path;

use crate::comparison::isolated::{fed_from_elsewhere, LocalErrors};
use crate::comparison::positions::{PositionReport, TraceRows};
use crate::comparison::{ComparedTraces, DiffReport, Floor, TraceComparison};
use crate::input::InputError;
use crate::style::Colors;

pub(crate) fn run(args: &DiffArgs, colors: &Colors) -> Result<Outcome, InputError> {
    if let Some(batch) = &args.batch {
        let alone = std::iter::once(&args.reference)
            .chain(&args.other)
            .map(|path| TraceRows::read(path))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = TraceRows::read(batch)?;
        let traces: Vec<&TraceRows> = alone.iter().chain([&batch]).collect();
        warn_routers_left_out(&traces);
        let report = PositionReport::batch(&alone, &batch, args.row_rtol)?;
        return emit_positions(&report, args.json);
    }
    let [other] = args.other.as_slice() else {
        return Err(format!(
            "diff compares two traces, REFERENCE and OTHER, not {}: several traces are a \
             batch's prompts run alone, with --batch BATCH",
            1 + args.other.len()
        ));
    };
    if let Some(report) = by_position(args, other)? {
        return emit_positions(&report, args.json);
    }
    let traces = ComparedTraces {
        reference: &args.reference,
        other,
        floor: args.floor.floor.as_deref().map(|path| Floor {
            path,
            factor: args.floor.floor_factor,
        }),
        quantized: args.split.quantized.as_deref(),
    };
    let comparison = TraceComparison::read(traces, args.compare.settings()?, args.pass)?;
    comparison.warn_stage_check();
    let Some(isolated_path) = &args.isolated else {
        let report = comparison.report();
        if args.json {
            crate::output::emit_json(&report)?;
        } else {
            comparison.warn_unused_overrides();
            crate::output::emit(&report.text(colors))?;
        }
        return Ok(if comparison.diverged() || comparison.routing_flagged() {
            Outcome::Diverged
        } else {
            Outcome::Ok
        });
    };
    // The isolated run's table is about the same pass as the other's.
    let table_pass = Some(comparison.table_pass());
    // With a floor, the isolated run is judged by the same tolerances, tensor by tensor.
    let isolated_traces = ComparedTraces {
        other: isolated_path,
        quantized: None,
        ..traces
    };
    let isolated = TraceComparison::read(isolated_traces, comparison.settings(), table_pass)?;
    if let Some(warning) = isolated.other_stage_check_warning("the isolated run") {
        eprintln!("model-trace: warning: {warning}");
    }
    let warning = fed_from_elsewhere(&args.reference, isolated_path, &isolated);
    let local = LocalErrors::new(&comparison, &isolated, warning);
    if args.json {
        crate::output::emit_json(&IsolatedDiffReport {
            report: comparison.report(),
            isolated: isolated.report(),
            local: &local,
        })?;
    } else {
        comparison.warn_unused_overrides();
        let mut text = comparison.report().text(colors);
        local.text(&mut text, colors);
        crate::output::emit(&text)?;
    }
    Ok(if local.diverged() || comparison.routing_flagged() {
        Outcome::Diverged
    } else {
        Outcome::Ok
    })
}

/// The comparison by position, when asked for (`--by-position`) or when both traces have rows
/// and their passes differ (then a comparison pass by pass would pair nothing).
fn by_position(args: &DiffArgs, other: &Path) -> Result<Option<PositionReport>, InputError> {
    let asked = args.by_position;
    let recorded = (
        TraceRows::recorded(&args.reference)?,
        TraceRows::recorded(other)?,
    );
    if !asked && recorded.0 != recorded.1 {
        eprintln!(
            "model-trace: warning: only {} has row summaries: compared pass by pass (record both \
             with rows to compare them by position)",
            if recorded.0 {
                args.reference.display()
            } else {
                other.display()
            }
        );
    }
    if !(asked || (recorded.0 && recorded.1)) {
        return Ok(None);
    }
    let (expected, actual) = (TraceRows::read(&args.reference)?, TraceRows::read(other)?);
    if !asked && !expected.rows.passes_differ(&actual.rows) {
        return Ok(None);
    }
    if args.split.quantized.is_some() {
        return Err(format!(
            "--quantized splits the error pass by pass, but {} and {} ran the tokens in other \
             passes (they are compared by position): record the three runs with the same passes",
            args.reference.display(),
            other.display()
        ));
    }
    warn_routers_left_out(&[&expected, &actual]);
    PositionReport::pair(&expected, &actual, args.row_rtol).map(Some)
}

/// Says on stderr that the comparison by position leaves the routers of `traces` out.
fn warn_routers_left_out(traces: &[&TraceRows]) {
    if let Some(warning) = TraceRows::routers_left_out(traces) {
        eprintln!("model-trace: warning: {warning}");
    }
}

fn emit_positions(report: &PositionReport, json: bool) -> Result<Outcome, InputError> {
    if json {
        crate::output::emit_json(report)?;
    } else {
        crate::output::emit(&report.text())?;
    }
    Ok(if report.comparison.diverged() {
        Outcome::Diverged
    } else {
        Outcome::Ok
    })
}

/// What `diff --json --isolated` writes: the report of OTHER, the report of ISOLATED, and the
/// comparison of the two per layer.
#[derive(Serialize)]
struct IsolatedDiffReport<'a> {
    #[serde(flatten)]
    report: DiffReport<'a>,
    /// `diff REFERENCE ISOLATED`, as `diff` alone would write it.
    isolated: DiffReport<'a>,
    #[serde(flatten)]
    local: &'a LocalErrors<'a>,
}
