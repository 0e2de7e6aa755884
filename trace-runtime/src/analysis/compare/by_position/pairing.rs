//! Which sequences of two runs are the same tokens: the same sequences of runs that split them
//! into other passes, or a batch's rows and their prompts alone, shifted by the padding.

use std::fmt;

use serde::Serialize;

use super::{Place, PositionRows};

/// How two runs' sequences are paired: the expected run's `sequence` with the actual run's
/// `actual_sequence`, its position `p` with the actual's `p + shift`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pairing {
    /// The expected run (its index among the expected runs: a batch's alone runs).
    pub run: usize,
    /// Its sequence.
    pub sequence: usize,
    /// The actual run's sequence.
    pub actual_sequence: usize,
    /// Added to an expected position to give the actual one (a row's left padding).
    pub shift: usize,
}

/// A place a run recorded twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The place.
    pub place: Place,
    /// The layer.
    pub layer: usize,
    /// The stage.
    pub stage: String,
    /// The passes that both recorded it.
    pub passes: (usize, usize),
}

/// Why runs cannot be lined up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PositionError {
    /// A run has no layer tensor with rows.
    NoRows {
        /// Which run.
        run: String,
        /// The first tensor whose rows were left out as not its pass's tokens, if any.
        misshapen: Option<String>,
    },
    /// A run recorded the same place twice.
    Overlap {
        /// Which run.
        run: String,
        /// Where.
        overlap: Overlap,
    },
    /// The runs hold other numbers of sequences: a batch against one run alone.
    Sequences {
        /// The expected run's.
        expected: usize,
        /// The actual run's.
        actual: usize,
    },
    /// A batch of `sequences` rows against another number of alone runs.
    BatchSize {
        /// Rows of the batch.
        sequences: usize,
        /// Runs alone.
        alone: usize,
    },
    /// A pass of the batch that does not lay its rows out as the batch's sequences (a
    /// `[seq, width]` tensor of a batched pass, whose rows cannot be told apart).
    BatchLayout {
        /// The pass.
        pass: usize,
        /// Its sequences.
        sequences: usize,
        /// The batch's rows.
        rows: usize,
    },
    /// A batch row whose first pass does not end with its alone run's prompt.
    PromptNotFound {
        /// The batch row.
        sequence: usize,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for PositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRows { run, misshapen } => {
                write!(
                    f,
                    "{run} has no row summaries: record it with rows \
                     (ModelTracerConfig::row_summaries; the examples' --rows), with its layers' \
                     tensors as [seq, width] or [batch, seq, width] and a forward pass that ran"
                )?;
                match misshapen {
                    Some(tensor) => write!(
                        f,
                        " (its tensors' rows are not their passes' tokens, first: {tensor})"
                    ),
                    None => Ok(()),
                }
            }
            Self::Overlap { run, overlap } => write!(
                f,
                "{run} recorded position {} of sequence {} twice (layer {} {}, passes {} and {}): \
                 a trace of more than one run, or a model whose #[trace_model] does not say \
                 `position = ..` (a pass is then at its number)",
                overlap.place.position,
                overlap.place.sequence,
                overlap.layer,
                overlap.stage,
                overlap.passes.0,
                overlap.passes.1
            ),
            Self::Sequences { expected, actual } => write!(
                f,
                "the expected run holds {expected} sequences and the actual one {actual}: compare \
                 a batch with its prompts alone with --batch (Consistency::check_batch)"
            ),
            Self::BatchLayout {
                pass,
                sequences,
                rows,
            } => write!(
                f,
                "pass {pass} of the batch lays its rows out as {sequences} sequences, not the \
                 batch's {rows}: record its layer tensors as [batch, seq, width]"
            ),
            Self::BatchSize { sequences, alone } => write!(
                f,
                "the batch has {sequences} rows but {alone} runs alone were given: one a row, in \
                 the batch's order"
            ),
            Self::PromptNotFound { sequence, reason } => {
                write!(f, "batch row {sequence}: {reason}")
            }
        }
    }
}

impl std::error::Error for PositionError {}

/// The sequences of `expected` paired with the same sequences of `actual`, positions as they
/// are: one run against another that split the same tokens into other passes.
pub fn pair_sequences(
    expected: &PositionRows,
    actual: &PositionRows,
) -> Result<Vec<Pairing>, PositionError> {
    check_usable(expected, "the expected run")?;
    check_usable(actual, "the actual run")?;
    if expected.sequences() != actual.sequences() {
        return Err(PositionError::Sequences {
            expected: expected.sequences(),
            actual: actual.sequences(),
        });
    }
    Ok((0..expected.sequences())
        .map(|sequence| Pairing {
            run: 0,
            sequence,
            actual_sequence: sequence,
            shift: 0,
        })
        .collect())
}

/// Row `b` of `batch` paired with `alone[b]`, shifted by its left padding: the batch's first
/// pass's width less `alone[b]`'s first pass's (its prompt), checked against the tokens where
/// both recorded them.
pub fn pair_batch(
    alone: &[&PositionRows],
    batch: &PositionRows,
) -> Result<Vec<Pairing>, PositionError> {
    check_usable(batch, "the batch")?;
    if let Some(pass) = batch.passes.iter().find(|p| p.sequences != alone.len()) {
        if batch.sequences() == alone.len() {
            return Err(PositionError::BatchLayout {
                pass: pass.pass,
                sequences: pass.sequences,
                rows: alone.len(),
            });
        }
    }
    if batch.sequences() != alone.len() {
        return Err(PositionError::BatchSize {
            sequences: batch.sequences(),
            alone: alone.len(),
        });
    }
    let Some(first) = batch.passes.first() else {
        return Err(PositionError::NoRows {
            run: "the batch".into(),
            misshapen: None,
        });
    };
    let mut pairings = Vec::with_capacity(alone.len());
    for (sequence, run) in alone.iter().enumerate() {
        check_usable(run, &format!("run alone {sequence}"))?;
        let not_found = |reason: String| PositionError::PromptNotFound { sequence, reason };
        let (start, prompt) = run
            .passes
            .first()
            .map_or((0, 0), |p| (p.position, p.columns));
        if start != 0 {
            return Err(not_found(format!(
                "its run alone begins at position {start}, not 0: the prompt alone must be its \
                 first pass"
            )));
        }
        let shift = (first.position + first.columns)
            .checked_sub(prompt)
            .ok_or_else(|| {
                not_found(format!(
                    "its prompt alone is {prompt} tokens, longer than the batch's first pass \
                 ({} columns)",
                    first.columns
                ))
            })?;
        for position in 0..prompt {
            let alone_token = run.token(Place {
                sequence: 0,
                position,
            });
            let batch_token = batch.token(Place {
                sequence,
                position: shift + position,
            });
            if let (Some(a), Some(b)) = (alone_token, batch_token) {
                if a != b {
                    return Err(not_found(format!(
                        "its prompt alone does not end the batch row (left padding of {shift}): \
                         position {position} holds token {a} alone, {b} in the batch"
                    )));
                }
            }
        }
        pairings.push(Pairing {
            run: sequence,
            sequence: 0,
            actual_sequence: sequence,
            shift,
        });
    }
    Ok(pairings)
}

/// Whether `rows` can be compared: it has rows, and no place twice.
fn check_usable(rows: &PositionRows, run: &str) -> Result<(), PositionError> {
    if rows.is_empty() {
        return Err(PositionError::NoRows {
            run: run.into(),
            misshapen: rows.misshapen.first().cloned(),
        });
    }
    if let Some(overlap) = &rows.overlap {
        return Err(PositionError::Overlap {
            run: run.into(),
            overlap: overlap.clone(),
        });
    }
    Ok(())
}
