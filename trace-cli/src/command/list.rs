//! `model-trace list FILE...`: what a trace (or the rank files of a run) holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use trace_runtime::Event;

use crate::command::Outcome;
use crate::header::describe_header;
use crate::input::{self, InputError, TraceRun};
use crate::style::Colors;

pub(crate) fn run(paths: &[PathBuf], colors: &Colors) -> Result<Outcome, InputError> {
    let run = TraceRun::open(paths)?;
    let ranked = run.is_ranked();
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut positions = Vec::new();
    let mut errors = Vec::new();
    let notes = input::read(&run, |file, event| {
        *kinds.entry(event.kind_name()).or_default() += 1;
        match event {
            Event::PassBegin(begin) => positions.push(begin.position),
            Event::Error(error) => errors.push(format!(
                "{}{} `{}`: {}",
                if ranked {
                    format!("{}: ", file.label())
                } else {
                    String::new()
                },
                error.kind,
                error.tracepoint,
                error.message
            )),
            _ => {}
        }
    })?;
    let header = run.header();
    let mut out = String::new();
    describe_header(&mut out, &run, notes.bytes, colors).map_err(|e| e.to_string())?;
    let _ = writeln!(
        out,
        "{}",
        colors.bold(&format!("tracepoints ({}):", header.tracepoints.len()))
    );
    // The selector (what `MODEL_TRACE` takes to pick this one alone) where the writer gave it.
    for tp in &header.tracepoints {
        let shown = if tp.selector.is_empty() {
            &tp.name
        } else {
            &tp.selector
        };
        let _ = writeln!(
            out,
            "  {:<9}  {}  ({} at {}:{})",
            tp.kind, shown, tp.function, tp.file, tp.line
        );
    }
    let _ = writeln!(out, "{} {}", colors.bold("passes:"), passes(&positions));
    let counted: Vec<String> = kinds
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let _ = writeln!(out, "{} {}", colors.bold("events:"), counted.join(", "));
    if errors.is_empty() {
        let _ = writeln!(out, "{} none", colors.bold("record errors:"));
    } else {
        let _ = writeln!(
            out,
            "{} {}",
            colors.bold("record errors:"),
            colors.warn(&errors.len().to_string())
        );
        for error in &errors {
            let _ = writeln!(out, "  {error}");
        }
    }
    for cut in &notes.truncated {
        let _ = writeln!(out, "{}", colors.warn(&format!("cut short: {cut}")));
    }
    if notes.truncated.is_empty() {
        for file in &notes.unfinished {
            let which = if ranked { file } else { "the file" };
            let _ = writeln!(
                out,
                "{}",
                colors.warn(&format!(
                    "cut short: {which} ends without a session_end event (the run did not finish)"
                ))
            );
        }
    }
    crate::output::emit(&out)?;
    Ok(Outcome::Ok)
}

/// `16 (positions 0, 5, 6, ..., 19)`.
fn passes(positions: &[usize]) -> String {
    let shown: Vec<String> = if positions.len() <= 8 {
        positions.iter().map(ToString::to_string).collect()
    } else {
        let mut shown: Vec<String> = positions[..3].iter().map(ToString::to_string).collect();
        shown.push("...".to_owned());
        shown.extend(
            positions[positions.len() - 2..]
                .iter()
                .map(ToString::to_string),
        );
        shown
    };
    if positions.is_empty() {
        "0".to_owned()
    } else {
        format!("{} (positions {})", positions.len(), shown.join(", "))
    }
}
