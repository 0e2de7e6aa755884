//! Runs of one model compared position by position (`diff --by-position`, `diff --batch`, and
//! `diff` on two traces with rows whose passes differ): the runtime's
//! [`by_position`](trace_runtime::compare::by_position) comparison of the rows each trace
//! recorded, read from the files.

use std::path::{Path, PathBuf};

use serde::Serialize;
use trace_runtime::compare::by_position::{
    compare_rows, pair_batch, pair_sequences, PositionComparison, PositionRows,
};
use trace_runtime::Event;

use crate::input::{read, InputError, TraceRun};

/// A trace's rows, read.
pub(crate) struct TraceRows {
    pub(crate) path: PathBuf,
    pub(crate) rows: PositionRows,
}

impl TraceRows {
    /// Reads the passes and layers of the trace at `path` (a file, or a run's ranks).
    pub(crate) fn read(path: &Path) -> Result<Self, InputError> {
        let run = TraceRun::open(&[path.to_path_buf()])?;
        let mut events = Vec::new();
        let notes = read(&run, |_, event| {
            if matches!(event, Event::PassBegin(_) | Event::Layer(_)) {
                events.push(event);
            }
        })?;
        if let Some(truncation) = notes.truncation() {
            eprintln!("model-trace: warning: {truncation}");
        }
        Ok(Self {
            path: path.to_path_buf(),
            rows: PositionRows::from_events(&events),
        })
    }

    /// Whether the header says rows were recorded.
    pub(crate) fn recorded(path: &Path) -> Result<bool, InputError> {
        let run = TraceRun::open(&[path.to_path_buf()])?;
        Ok(run.header().config.row_summaries)
    }
}

/// What `diff` by position reports.
#[derive(Serialize)]
pub(crate) struct PositionReport {
    /// `by_position` or `batch`.
    pub(crate) mode: &'static str,
    /// The expected traces: the reference, or the runs alone of a batch's rows.
    pub(crate) expected: Vec<PathBuf>,
    /// The trace compared with them.
    pub(crate) actual: PathBuf,
    #[serde(flatten)]
    pub(crate) comparison: PositionComparison,
}

impl PositionReport {
    /// `actual`'s rows against `expected`'s, the same sequences at the same positions.
    pub(crate) fn pair(
        expected: &TraceRows,
        actual: &TraceRows,
        rtol: f64,
    ) -> Result<Self, InputError> {
        let pairings = pair_sequences(&expected.rows, &actual.rows).map_err(|e| e.to_string())?;
        Ok(Self {
            mode: "by_position",
            expected: vec![expected.path.clone()],
            actual: actual.path.clone(),
            comparison: compare_rows(&[&expected.rows], &actual.rows, pairings, rtol),
        })
    }

    /// Each row of `batch` against its run `alone`.
    pub(crate) fn batch(
        alone: &[TraceRows],
        batch: &TraceRows,
        rtol: f64,
    ) -> Result<Self, InputError> {
        let expected: Vec<&PositionRows> = alone.iter().map(|a| &a.rows).collect();
        let pairings = pair_batch(&expected, &batch.rows).map_err(|e| e.to_string())?;
        Ok(Self {
            mode: "batch",
            expected: alone.iter().map(|a| a.path.clone()).collect(),
            actual: batch.path.clone(),
            comparison: compare_rows(&expected, &batch.rows, pairings, rtol),
        })
    }

    /// The report as text.
    pub(crate) fn text(&self) -> String {
        let expected = match self.expected.as_slice() {
            [one] => one.display().to_string(),
            many => format!("the {} runs alone", many.len()),
        };
        self.comparison
            .describe(&expected, &self.actual.display().to_string())
    }
}
