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
use crate::precision::WeightsSaid;

/// A trace's rows, read.
pub(crate) struct TraceRows {
    pub(crate) path: PathBuf,
    pub(crate) rows: PositionRows,
    /// What the header says of the run's weights.
    weights: WeightsSaid,
    /// Router calls in the trace (compared pass by pass only, not by position).
    pub(crate) router_calls: usize,
}

impl TraceRows {
    /// Reads the passes and layers of the trace at `path` (a file, or a run's ranks).
    pub(crate) fn read(path: &Path) -> Result<Self, InputError> {
        let run = TraceRun::open(&[path.to_path_buf()])?;
        let mut events = Vec::new();
        let mut router_calls = 0;
        let notes = read(&run, |_, event| {
            router_calls += usize::from(matches!(event, Event::Router(_)));
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
            weights: WeightsSaid::of(run.header()),
            router_calls,
        })
    }

    /// Whether the header says the weights are quantized GGUF types (`Q4_1`, `Q6_K`, ...) and
    /// not dequantized (its `metadata.precision`, else its dtype text): then the kernels'
    /// 8-bit rounding of their inputs sets the floor.
    fn quantized(&self) -> bool {
        self.weights.is_quantized()
    }

    /// A warning when any of `traces` has router calls: the comparison by position leaves
    /// them out.
    pub(crate) fn routers_left_out(traces: &[&Self]) -> Option<String> {
        let with: Vec<String> = (traces.iter())
            .filter(|t| t.router_calls > 0)
            .map(|t| format!("{} ({} calls)", t.path.display(), t.router_calls))
            .collect();
        (!with.is_empty()).then(|| {
            format!(
                "the routers of {} are not compared by position (only pass by pass: record the \
                 runs with the same passes)",
                with.join(", ")
            )
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
    /// Whether a trace's header says its weights are quantized.
    #[serde(skip)]
    quantized: bool,
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
        let pairings = pair_sequences(&expected.rows, &actual.rows).map_err(|e| {
            format!(
                "{} against {} by position: {e}",
                actual.path.display(),
                expected.path.display()
            )
        })?;
        Ok(Self {
            mode: "by_position",
            quantized: expected.quantized() || actual.quantized(),
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
        let pairings = pair_batch(&expected, &batch.rows)
            .map_err(|e| format!("{} against its rows alone: {e}", batch.path.display()))?;
        Ok(Self {
            mode: "batch",
            quantized: batch.quantized() || alone.iter().any(TraceRows::quantized),
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
        let mut text = self
            .comparison
            .describe(&expected, &self.actual.display().to_string());
        if self.quantized && self.comparison.first.is_some() {
            text.push_str(
                "note: the header says the weights are quantized: kernels that round their \
                 input to 8 bits turn a rounding difference between one row and many into a \
                 quantization step now and then, so this may be the floor, not a bug; compare \
                 runs on dequantized weights (candle: CANDLE_DEQUANTIZE_ALL=1; the examples' \
                 --dequantize)\n",
            );
        }
        text
    }
}
