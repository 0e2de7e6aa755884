//! The model against itself in tests: the same tokens computed two ways must agree to rounding.
//!
//! Three relations hold for any correct transformer, and need no reference model: N tokens in
//! one prefill pass and the same tokens as a prefill of K plus N − K decode steps; a prompt
//! whole and in chunks; a batch of prompts (left-padded, masked) and each prompt alone. A bug of
//! the KV cache, of the rotary offset of a decode step, of a mask or of padding breaks one of
//! them, at the first position it touches. [`Consistency::check`] runs two closures, each in a
//! session of its own that records every layer tensor row by row
//! ([`RowSummaries`](crate::RowSummaries)), lines their rows up by position
//! ([`compare::by_position`](crate::compare::by_position)) and panics naming the first
//! (position, layer, stage) past tolerance, with the error, the tolerance and each side's pass:
//!
//! ```no_run
//! # use trace_runtime as model_trace;
//! # struct Model;
//! # impl Model { fn clear(&mut self) {} fn forward(&mut self, _: &[u32], _: usize) {} }
//! # let mut model = Model;
//! # let tokens = vec![1_u32; 600];
//! use model_trace::consistency::Consistency;
//!
//! let model = std::cell::RefCell::new(model);
//! let agreement = Consistency::new("prefill of 590 + 10 decode steps = one pass of 600").check(
//!     || {
//!         model.borrow_mut().clear();
//!         model.borrow_mut().forward(&tokens, 0);
//!     },
//!     || {
//!         let mut model = model.borrow_mut();
//!         model.clear();
//!         model.forward(&tokens[..590], 0);
//!         for (i, token) in tokens[590..].iter().enumerate() {
//!             model.forward(&[*token], 590 + i);
//!         }
//!     },
//! );
//! println!("floor: {:.2e}", agreement.comparison.max_error());
//! ```
//!
//! What the model must record:
//!
//! - **Where each pass begins**: `#[trace_model(position = ..)]`, the position of the pass's
//!   first token (of a batch: its first column, padding included: 0 for the prefill, then the
//!   padded width, and one more each decode step). Without it a pass is at its number, and the
//!   check fails saying that a position was recorded twice.
//! - **Its layer tensors as `[seq, width]` or `[batch, seq, width]`**: a token's row is the last
//!   dimension (a `Vec<f32>` has no rows: give its shape, `TensorRef::new(&values, &[seq,
//!   hidden])`, or use a tensor type). Tensors of other ranks (per-head ones) are left out and
//!   said to be.
//! - **Its tokens**, best: `#[trace_model(tokens = ..)]`, a batch's rows one after another with
//!   their padding ids. Then the runs' tokens are checked (a position holding other tokens ends
//!   the comparison there, and fails it), and a batch row's left padding (its first pass's width
//!   less the prompt's, the prompt being its run alone's first pass) is checked against them.
//!
//! A batch against its prompts alone, the closures alone in the batch's row order:
//!
//! ```no_run
//! # use trace_runtime as model_trace;
//! # struct Model;
//! # impl Model {
//! #     fn generate(&mut self, _: &[u32], _: usize) -> Vec<u32> { Vec::new() }
//! #     fn generate_batch(&mut self, _: &[Vec<u32>], _: usize) -> Vec<Vec<u32>> { Vec::new() }
//! # }
//! # let prompts: Vec<Vec<u32>> = Vec::new();
//! use model_trace::consistency::Consistency;
//!
//! let model = std::cell::RefCell::new(Model);
//! let agreement = Consistency::new("a batch = each prompt alone").check_batch(
//!     prompts.iter().map(|prompt| || model.borrow_mut().generate(prompt, 8)),
//!     || model.borrow_mut().generate_batch(&prompts, 8),
//! );
//! assert_eq!(agreement.expected.len(), prompts.len());
//! ```
//!
//! The check fails on a row past tolerance, on tokens that differ, on rows of the expected run
//! that the other lacks, and when nothing at all was compared. Sessions ignore `MODEL_TRACE`
//! and the other environment variables, like a golden check's.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::analysis::compare::by_position::{
    compare_rows, pair_batch, pair_sequences, PositionComparison, PositionError, PositionRows,
    DEFAULT_ROW_RTOL,
};
use crate::config::{DigestPolicy, ModelTracerConfig};
use crate::record::Event;
use crate::session::{run_recorded, RecordError, SessionError};
use crate::sink::{SinkError, TraceSink};

/// A relation between two ways of running a model, checked row by row ([module docs](self)).
#[derive(Debug, Clone)]
pub struct Consistency {
    relation: String,
    rtol: f64,
    filter: Option<String>,
}

/// What a check returns: what each closure returned, and the comparison (its
/// [`max_error`](PositionComparison::max_error) is the floor the runs showed).
#[derive(Debug)]
pub struct Agreement<E, A> {
    /// What the expected closure returned (the runs alone, for a batch).
    pub expected: E,
    /// What the actual closure returned.
    pub actual: A,
    /// The rows compared.
    pub comparison: PositionComparison,
}

impl Consistency {
    /// A relation, named for the messages (`"prefill + decode = one pass"`), with the default
    /// tolerance [`DEFAULT_ROW_RTOL`].
    pub fn new(relation: impl Into<String>) -> Self {
        Self {
            relation: relation.into(),
            rtol: DEFAULT_ROW_RTOL,
            filter: None,
        }
    }

    /// The largest relative error a row may have
    /// ([`Row::relative_error`](crate::Row::relative_error)); 0 asks for the same bits. Panics if it is negative or not a number (every row would pass).
    #[must_use]
    #[track_caller]
    pub fn rtol(mut self, rtol: f64) -> Self {
        assert!(
            rtol >= 0.0,
            "consistency tolerance must be a number of at least 0, not {rtol}"
        );
        self.rtol = rtol;
        self
    }

    /// Records only the tracepoints `filter` admits ([`TraceFilter`](crate::TraceFilter) syntax).
    #[must_use]
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// Runs `expected`, then `actual`, and compares their rows by position; panics naming the
    /// first (position, layer, stage) past tolerance, or tokens that differ.
    #[track_caller]
    pub fn check<E, A>(
        &self,
        expected: impl FnOnce() -> E,
        actual: impl FnOnce() -> A,
    ) -> Agreement<E, A> {
        let (expected, actual, outcome) = self.compare(expected, actual);
        self.conclude(
            expected,
            actual,
            outcome,
            ("the expected run", "the actual run"),
        )
    }

    /// [`check`](Self::check) without the panic: what the closures returned, and the
    /// comparison or why there is none.
    pub fn compare<E, A>(
        &self,
        expected: impl FnOnce() -> E,
        actual: impl FnOnce() -> A,
    ) -> (E, A, Result<PositionComparison, ConsistencyError>) {
        let (expected_value, expected_rows) = self.record(expected);
        let (actual_value, actual_rows) = self.record(actual);
        let outcome = (|| {
            let (expected_rows, actual_rows) = (expected_rows?, actual_rows?);
            let pairings = pair_sequences(&expected_rows, &actual_rows)?;
            Ok(compare_rows(
                &[&expected_rows],
                &actual_rows,
                pairings,
                self.rtol,
            ))
        })();
        (expected_value, actual_value, outcome)
    }

    /// Runs each of `alone` (one prompt each, in the batch's row order), then `batch`, and
    /// compares each batch row with its run alone, padding left out; panics naming the batch
    /// row, position, layer and stage of the first row past tolerance.
    #[track_caller]
    pub fn check_batch<E, A, F: FnOnce() -> E>(
        &self,
        alone: impl IntoIterator<Item = F>,
        batch: impl FnOnce() -> A,
    ) -> Agreement<Vec<E>, A> {
        let (expected, actual, outcome) = self.compare_batch(alone, batch);
        self.conclude(expected, actual, outcome, ("the runs alone", "the batch"))
    }

    /// [`check_batch`](Self::check_batch) without the panic.
    pub fn compare_batch<E, A, F: FnOnce() -> E>(
        &self,
        alone: impl IntoIterator<Item = F>,
        batch: impl FnOnce() -> A,
    ) -> (Vec<E>, A, Result<PositionComparison, ConsistencyError>) {
        let mut values = Vec::new();
        let mut runs = Vec::new();
        for run in alone {
            let (value, rows) = self.record(run);
            values.push(value);
            runs.push(rows);
        }
        let (batch_value, batch_rows) = self.record(batch);
        let outcome = (|| {
            let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
            let batch_rows = batch_rows?;
            let expected: Vec<&PositionRows> = runs.iter().collect();
            let pairings = pair_batch(&expected, &batch_rows)?;
            Ok(compare_rows(&expected, &batch_rows, pairings, self.rtol))
        })();
        (values, batch_value, outcome)
    }

    #[track_caller]
    fn conclude<E, A>(
        &self,
        expected: E,
        actual: A,
        outcome: Result<PositionComparison, ConsistencyError>,
        labels: (&str, &str),
    ) -> Agreement<E, A> {
        let comparison = match outcome {
            Ok(comparison) => comparison,
            Err(error) => panic!("consistency check {:?}: {error}", self.relation),
        };
        // Rows past tolerance, tokens that differ, rows one run lacks, or none compared.
        if comparison.diverged() {
            panic!(
                "consistency check failed: {}\n{}",
                self.relation,
                comparison.describe(labels.0, labels.1)
            );
        }
        Agreement {
            expected,
            actual,
            comparison,
        }
    }

    /// Runs `run` in a session that records every layer tensor's rows.
    fn record<R>(&self, run: impl FnOnce() -> R) -> (R, Result<PositionRows, ConsistencyError>) {
        let recorder = Recorder::default();
        let config = ModelTracerConfig {
            trace_activations: true,
            row_summaries: true,
            digests: DigestPolicy::Off,
            ..ModelTracerConfig::default()
        };
        let (value, recorded) = run_recorded(config, self.filter.as_deref(), recorder.clone(), run);
        let outcome = match recorded {
            Err(error) => Err(ConsistencyError::Session(error)),
            Ok(errors) if !errors.is_empty() => Err(ConsistencyError::Recording(errors)),
            Ok(_) => Ok(PositionRows::from_events(&recorder.take())),
        };
        (value, outcome)
    }
}

/// Why a consistency check could not compare.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsistencyError {
    /// The session could not start (a filter that does not parse).
    Session(SessionError),
    /// Values the session could not record.
    Recording(Vec<RecordError>),
    /// The runs cannot be lined up (no rows, a batch of another size, a prompt not found).
    Positions(PositionError),
}

impl fmt::Display for ConsistencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session(error) => write!(f, "the session could not start: {error}"),
            Self::Recording(errors) => {
                write!(f, "{} values could not be recorded", errors.len())?;
                for error in errors.iter().take(3) {
                    write!(f, "; {error}")?;
                }
                Ok(())
            }
            Self::Positions(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ConsistencyError {}

impl From<PositionError> for ConsistencyError {
    fn from(error: PositionError) -> Self {
        Self::Positions(error)
    }
}

/// Keeps the events that place rows: pass begins and layers.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Event>>>);

impl Recorder {
    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl TraceSink for Recorder {
    fn name(&self) -> std::borrow::Cow<'_, str> {
        "consistency check".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        if matches!(event, Event::PassBegin(_) | Event::Layer(_)) {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event.clone());
        }
        Ok(())
    }
}
