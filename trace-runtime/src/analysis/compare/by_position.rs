//! Comparing runs of one model that computed the same tokens in other forward passes, row by row
//! at each token's position: one prefill pass against a prefill and decode steps, a prompt whole
//! against in chunks, a batch of prompts against each prompt alone.
//!
//! Such runs need no reference: the same code on the same tokens must agree to float rounding,
//! position by position, and a KV cache, rotary offset, mask or padding bug breaks exactly that.
//! Their passes do not line up (a pass of 600 rows against 600 passes of one), so tensors are not
//! paired by pass as [`compare`](super::compare) pairs them; each layer tensor's rows are, by
//! (sequence, position, layer, stage), from the [`RowSummaries`](crate::RowSummaries) the session
//! recorded ([`ModelTracerConfig::row_summaries`](crate::ModelTracerConfig::row_summaries)).
//!
//! - **Where a row sits.** A pass begins at `position` (`#[trace_model(position = ..)]`); row `r`
//!   of a `[batch, seq, width]` layer tensor (or `[seq, width]`) is column `r % seq` of sequence
//!   `r / seq`, at position `position + r % seq`. Tensors of other ranks have no rows
//!   ([`RowSummaries::of_shape`]), and a tensor whose rows are not the pass's tokens in number
//!   (where the pass recorded them) is left out, and said. A pass without `position = ..` is at
//!   its pass number, which soon puts two rows of one run at one place: that is an error
//!   ([`PositionError::Overlap`]), never a verdict.
//! - **Tokens.** Where both runs recorded their passes' token ids
//!   (`#[trace_model(tokens = ..)]`), a position holding another token on each side ends the
//!   comparison of that sequence there (the runs computed other text from then on), and is a
//!   finding of its own.
//! - **A batch.** Row `b` of a batch is lined up with the `b`-th run alone: left padding is the
//!   batch's first pass's width less the prompt's (the alone run's first pass), checked against
//!   the tokens; padding columns are left out.
//! - **Error.** Equal fingerprints are the same bits (error 0); otherwise the error is
//!   `‖b − a‖₂ / ‖a‖₂` estimated from the rows' sketches and norms
//!   ([`Row::relative_error`]), `a` the expected run's row.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::record::{Event, LayerEvent, PassBegin};
use crate::summary::{Row, RowSummaries};

/// The relative error ([`Row::relative_error`]) a row may have before it is past tolerance,
/// when none is asked for. Measured over 600 positions of SmolLM2-135M and Gemma 3 270M on
/// their dequantized f32 weights (x86 with AVX-512): one pass against a prefill and decode
/// steps at most 9.1e-6 and 1.7e-5, a padded batch against each prompt alone 9.9e-6 and
/// 2.2e-5, chunks bit-identical; a KV cache kept in f16 is first seen at 5.6e-5 and 1.1e-4. A
/// port whose matmuls round their input to 8 bits (a quantized one) has a floor of a few per
/// cent instead (a rounding difference between a kernel's one-row and many-row paths, now and
/// then turned into a quantization step): compare its dequantized weights.
pub const DEFAULT_ROW_RTOL: f64 = 5e-5;

/// Where a row sits: its sequence (a batch's row; 0 without a batch) and position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Place {
    /// The sequence: the row of the batch.
    pub sequence: usize,
    /// The token's position in its sequence.
    pub position: usize,
}

/// One row of a layer tensor, as [`PositionRows`] keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct TracedRow {
    /// The pass that computed it.
    pub pass: usize,
    /// Its stage's place in the layer record (`input` first, `output` last): the order the
    /// stages were computed in.
    pub stage_index: usize,
    /// The row.
    pub row: Row,
}

/// How one pass laid its rows out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PassLayout {
    /// The pass.
    pub pass: usize,
    /// The position of its first column.
    pub position: usize,
    /// Its sequences (batch rows).
    pub sequences: usize,
    /// Its columns (tokens per sequence).
    pub columns: usize,
}

/// The rows of a trace's layer tensors, by (sequence, position, layer, stage).
#[derive(Debug, Clone, Default)]
pub struct PositionRows {
    rows: BTreeMap<(Place, usize, String), TracedRow>,
    tokens: BTreeMap<Place, u32>,
    passes: Vec<PassLayout>,
    /// Layer tensors recorded without rows, by `layer.{i}.{stage}`.
    without_rows: BTreeSet<String>,
    /// The first row found twice at the same place: a trace of several runs, or a model whose
    /// passes do not say their position (then each pass is at its number).
    overlap: Option<Overlap>,
    /// Tensors whose rows do not fit their shape, by `pass {p} layer.{i}.{stage}`.
    misshapen: Vec<String>,
}

impl PositionRows {
    /// Indexes the rows of `events` (a trace's, in order).
    pub fn from_events<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut index = Self::default();
        let mut begun: BTreeMap<usize, &PassBegin> = BTreeMap::new();
        for event in events {
            match event {
                Event::PassBegin(begin) => {
                    begun.insert(begin.pass, begin);
                }
                Event::Layer(layer) => {
                    if let Some(begin) = begun.get(&layer.pass) {
                        index.add_layer(layer, begin);
                    }
                }
                _ => {}
            }
        }
        index
    }

    /// Indexes the rows of `layer`'s tensors, in the pass `begin` began.
    fn add_layer(&mut self, layer: &LayerEvent, begin: &PassBegin) {
        for (stage_index, stage) in layer.stages.iter().enumerate() {
            let name = format!("layer.{}.{}", layer.layer, stage.name);
            let Some(rows) = &stage.tensor.rows else {
                self.without_rows.insert(name);
                continue;
            };
            let Some(layout) = layout_of(&stage.tensor.shape, rows, begin, layer.pass) else {
                self.misshapen.push(format!("pass {} {name}", layer.pass));
                continue;
            };
            match self.passes.last() {
                Some(last) if last.pass == layer.pass && *last != layout => {
                    // Another layout than the pass's first tensor: rows that are not its tokens.
                    self.misshapen.push(format!("pass {} {name}", layer.pass));
                    continue;
                }
                Some(last) if last.pass == layer.pass => {}
                _ => self.lay_out(layout, begin.tokens.as_deref()),
            }
            for r in 0..rows.len() {
                let place = Place {
                    sequence: r / layout.columns,
                    position: begin.position + r % layout.columns,
                };
                let Some(row) = rows.row(r) else { continue };
                let entry = TracedRow {
                    pass: layer.pass,
                    stage_index,
                    row,
                };
                match self
                    .rows
                    .entry((place, layer.layer, stage.name.to_string()))
                {
                    Entry::Vacant(slot) => {
                        slot.insert(entry);
                    }
                    Entry::Occupied(first) => {
                        self.overlap.get_or_insert_with(|| Overlap {
                            place,
                            layer: layer.layer,
                            stage: stage.name.to_string(),
                            passes: (first.get().pass, layer.pass),
                        });
                    }
                }
            }
        }
    }

    fn lay_out(&mut self, layout: PassLayout, tokens: Option<&[u32]>) {
        self.passes.push(layout);
        let Some(tokens) = tokens.filter(|t| t.len() == layout.sequences * layout.columns) else {
            return;
        };
        for (i, &token) in tokens.iter().enumerate() {
            let place = Place {
                sequence: i / layout.columns,
                position: layout.position + i % layout.columns,
            };
            self.tokens.entry(place).or_insert(token);
        }
    }

    /// Rows indexed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no layer tensor had rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The passes that recorded rows, in order.
    pub fn passes(&self) -> &[PassLayout] {
        &self.passes
    }

    /// The sequences (batch rows) seen.
    pub fn sequences(&self) -> usize {
        self.passes.iter().map(|p| p.sequences).max().unwrap_or(0)
    }

    /// The token at `place`, where the pass recorded its tokens.
    pub fn token(&self, place: Place) -> Option<u32> {
        self.tokens.get(&place).copied()
    }

    /// Layer tensors recorded without rows (`layer.{i}.{stage}`).
    pub fn without_rows(&self) -> &BTreeSet<String> {
        &self.without_rows
    }

    /// Whether the passes' boundaries differ from `other`'s: then only a comparison by
    /// position can pair their tensors.
    pub fn passes_differ(&self, other: &Self) -> bool {
        let boundaries = |rows: &Self| {
            rows.passes
                .iter()
                .map(|p| (p.position, p.sequences, p.columns))
                .collect::<Vec<_>>()
        };
        boundaries(self) != boundaries(other)
    }

    /// What a reader of a comparison should know about this trace's rows (rows
    /// that do not fit, tensors without rows), each a sentence.
    fn notes(&self, label: &str) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.misshapen.is_empty() {
            notes.push(format!(
                "{label}: {} tensors' rows are not their pass's tokens (a shape other than \
                 [batch, seq, width] with batch·seq tokens) and were left out (first: {})",
                self.misshapen.len(),
                self.misshapen[0]
            ));
        }
        if !self.without_rows.is_empty() && !self.rows.is_empty() {
            let names: Vec<&str> = self
                .without_rows
                .iter()
                .take(3)
                .map(String::as_str)
                .collect();
            notes.push(format!(
                "{label}: {} layer tensors have no rows and were not compared ({}{})",
                self.without_rows.len(),
                names.join(", "),
                if self.without_rows.len() > 3 {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
        notes
    }
}

/// How a layer tensor of `shape` lays out its `rows` in the pass `begin` began: `[seq, width]`
/// or `[batch, seq, width]`, with as many rows as the pass's tokens where it recorded them;
/// `None` for anything else.
fn layout_of(
    shape: &[usize],
    rows: &RowSummaries,
    begin: &PassBegin,
    pass: usize,
) -> Option<PassLayout> {
    let (sequences, columns) = match *shape {
        [seq, _] => (1, seq),
        [batch, seq, _] => (batch, seq),
        _ => return None,
    };
    let count = sequences * columns;
    let tokens = begin.tokens.as_ref().map_or(count, Vec::len);
    (columns > 0 && rows.len() == count && tokens == count && rows.is_consistent()).then_some(
        PassLayout {
            pass,
            position: begin.position,
            sequences,
            columns,
        },
    )
}

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

/// A pair of rows, at the expected run's place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowDifference {
    /// The expected run (0, or the batch row's alone run).
    pub run: usize,
    /// The expected row's place.
    pub place: Place,
    /// The actual row's place.
    pub actual_place: Place,
    /// The layer.
    pub layer: usize,
    /// The stage (`input`, `output`, `attn_out`, ...).
    pub stage: String,
    /// Its place in the layer record: the order of computation.
    #[serde(skip)]
    pub stage_index: usize,
    /// `‖b − a‖₂ / ‖a‖₂`, estimated ([`Row::relative_error`]); 0 for the same bits.
    pub error: f64,
    /// The pass of each side that computed it.
    pub passes: (usize, usize),
}

impl RowDifference {
    fn order(&self) -> (usize, usize, usize, usize) {
        (
            self.place.position,
            self.layer,
            self.stage_index,
            self.actual_place.sequence,
        )
    }
}

/// The first position of a pairing where the runs hold other tokens: later positions computed
/// other text and are not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenMismatch {
    /// The sequences paired.
    pub pairing: Pairing,
    /// The expected run's position.
    pub position: usize,
    /// The expected run's token there.
    pub expected: u32,
    /// The actual run's.
    pub actual: u32,
}

/// Two runs compared by position ([`compare_rows`]).
#[derive(Debug, Clone, Serialize)]
pub struct PositionComparison {
    /// The tolerance on [`RowDifference::error`].
    pub rtol: f64,
    /// How the sequences were paired.
    pub pairings: Vec<Pairing>,
    /// Passes that recorded rows: of the expected runs together, and of the actual run.
    pub passes: (usize, usize),
    /// Row pairs compared.
    pub compared: usize,
    /// Of them, bit-identical.
    pub bit_identical: usize,
    /// Expected rows whose place the actual run did not record (before any token mismatch).
    pub unpaired: usize,
    /// The first pair past tolerance: earliest position, then layer, then stage.
    pub first: Option<RowDifference>,
    /// Pairs past tolerance.
    pub past_tolerance: usize,
    /// Each layer's largest error, with where.
    pub worst_by_layer: BTreeMap<usize, RowDifference>,
    /// Per pairing, the first position whose tokens differ.
    pub token_mismatches: Vec<TokenMismatch>,
    /// Whether token ids were compared (both runs recorded them).
    pub tokens_checked: bool,
    /// What a reader should know (rows left out, tokens not recorded).
    pub notes: Vec<String>,
}

/// Compares every row of `expected` runs with its partner in `actual`, as `pairings` pair them.
pub fn compare_rows(
    expected: &[&PositionRows],
    actual: &PositionRows,
    pairings: Vec<Pairing>,
    rtol: f64,
) -> PositionComparison {
    let mut comparison = PositionComparison {
        rtol,
        pairings: Vec::new(),
        passes: (
            expected.iter().map(|run| run.passes.len()).sum(),
            actual.passes.len(),
        ),
        compared: 0,
        bit_identical: 0,
        unpaired: 0,
        first: None,
        past_tolerance: 0,
        worst_by_layer: BTreeMap::new(),
        token_mismatches: Vec::new(),
        tokens_checked: false,
        notes: Vec::new(),
    };
    for pairing in &pairings {
        let Some(run) = expected.get(pairing.run) else {
            continue;
        };
        comparison.compare_pairing(run, actual, *pairing);
    }
    for (i, run) in expected.iter().enumerate() {
        let label = if expected.len() > 1 {
            format!("run alone {i}")
        } else {
            "the expected run".to_owned()
        };
        comparison.notes.extend(run.notes(&label));
    }
    comparison.notes.extend(actual.notes("the actual run"));
    if !comparison.tokens_checked {
        comparison.notes.push(
            "token ids were not recorded on both sides (#[trace_model(tokens = ..)]): rows were \
             lined up by position alone"
                .into(),
        );
    }
    comparison.pairings = pairings;
    comparison
}

impl PositionComparison {
    fn compare_pairing(&mut self, run: &PositionRows, actual: &PositionRows, pairing: Pairing) {
        let cutoff = self.token_cutoff(run, actual, pairing);
        let from = (
            Place {
                sequence: pairing.sequence,
                position: 0,
            },
            0,
            String::new(),
        );
        for ((place, layer, stage), expected_row) in run.rows.range(from..) {
            if place.sequence != pairing.sequence {
                break;
            }
            if cutoff.is_some_and(|cutoff| place.position >= cutoff) {
                continue;
            }
            let actual_place = Place {
                sequence: pairing.actual_sequence,
                position: place.position + pairing.shift,
            };
            let Some(actual_row) = actual.rows.get(&(actual_place, *layer, stage.clone())) else {
                self.unpaired += 1;
                continue;
            };
            let difference = RowDifference {
                run: pairing.run,
                place: *place,
                actual_place,
                layer: *layer,
                stage: stage.clone(),
                stage_index: expected_row.stage_index,
                error: expected_row.row.relative_error(&actual_row.row),
                passes: (expected_row.pass, actual_row.pass),
            };
            self.count(difference);
        }
    }

    /// The first position whose tokens differ between the paired sequences, noted.
    fn token_cutoff(
        &mut self,
        run: &PositionRows,
        actual: &PositionRows,
        pairing: Pairing,
    ) -> Option<usize> {
        let mut checked = false;
        for (place, &token) in run.tokens.range(
            Place {
                sequence: pairing.sequence,
                position: 0,
            }..,
        ) {
            if place.sequence != pairing.sequence {
                break;
            }
            let actual_place = Place {
                sequence: pairing.actual_sequence,
                position: place.position + pairing.shift,
            };
            let Some(other) = actual.token(actual_place) else {
                continue;
            };
            checked = true;
            if other != token {
                self.tokens_checked = true;
                self.token_mismatches.push(TokenMismatch {
                    pairing,
                    position: place.position,
                    expected: token,
                    actual: other,
                });
                return Some(place.position);
            }
        }
        self.tokens_checked |= checked;
        None
    }

    fn count(&mut self, difference: RowDifference) {
        self.compared += 1;
        if difference.error == 0.0 {
            self.bit_identical += 1;
        }
        let worst = self
            .worst_by_layer
            .entry(difference.layer)
            .or_insert_with(|| difference.clone());
        if difference.error > worst.error {
            *worst = difference.clone();
        }
        if difference.error > self.rtol || difference.error.is_nan() {
            self.past_tolerance += 1;
            if self
                .first
                .as_ref()
                .is_none_or(|first| difference.order() < first.order())
            {
                self.first = Some(difference);
            }
        }
    }

    /// Whether the runs do not agree: a row past tolerance, tokens that differ, expected rows
    /// the actual run lacks, or nothing compared at all.
    pub fn diverged(&self) -> bool {
        self.first.is_some()
            || !self.token_mismatches.is_empty()
            || self.unpaired > 0
            || self.compared == 0
    }

    /// The largest error of any pair: the floor the runs showed.
    pub fn max_error(&self) -> f64 {
        self.worst_by_layer
            .values()
            .map(|d| d.error)
            .fold(0.0, f64::max)
    }

    /// The comparison in a few lines: the verdict, the first pair past tolerance, the layers'
    /// worst errors, and the notes.
    pub fn describe(&self, expected: &str, actual: &str) -> String {
        let mut text = String::new();
        let batch = self.pairings.iter().any(|p| p.run > 0);
        let _ = writeln!(
            text,
            "by position: {} passes of {actual} against {} of {expected}{}: {} row pairs \
             compared, {} bit-identical; tolerance {:e} (relative L2 error, estimated from the \
             rows' sketches)",
            self.passes.1,
            self.passes.0,
            if batch {
                ", each batch row against its run alone, padding left out"
            } else {
                ""
            },
            self.compared,
            self.bit_identical,
            self.rtol
        );
        match &self.first {
            Some(first) => {
                let _ = writeln!(
                    text,
                    "first past tolerance: {} layer {} stage {}: error {:.3e} ({}; pass {} of \
                     {expected}, pass {} of {actual}); {} pairs past it",
                    describe_place(first, batch),
                    first.layer,
                    first.stage,
                    first.error,
                    self.times_tolerance(first.error),
                    first.passes.0,
                    first.passes.1,
                    self.past_tolerance
                );
            }
            None if self.compared > 0 => {
                let _ = writeln!(
                    text,
                    "no row past tolerance (largest error {:.3e})",
                    self.max_error()
                );
            }
            None if self.token_mismatches.is_empty() => {
                let _ = writeln!(text, "no row pairs: the runs share no position");
            }
            None => {}
        }
        for mismatch in &self.token_mismatches {
            let row = if batch {
                format!("batch row {} ", mismatch.pairing.actual_sequence)
            } else {
                String::new()
            };
            let _ = writeln!(
                text,
                "{row}tokens differ from position {} ({} in {expected}, {} in {actual}): later \
                 positions were not compared",
                mismatch.position, mismatch.expected, mismatch.actual
            );
        }
        if self.unpaired > 0 {
            let _ = writeln!(
                text,
                "{} rows of {expected} have no row at the same place in {actual}: the runs do \
                 not cover the same positions",
                self.unpaired
            );
        }
        let _ = writeln!(text, "worst error per layer:");
        for (layer, worst) in &self.worst_by_layer {
            let _ = writeln!(
                text,
                "  layer {layer:>3}: {:.3e} ({}) at {}, {}",
                worst.error,
                self.times_tolerance(worst.error),
                describe_place(worst, batch),
                worst.stage
            );
        }
        for note in &self.notes {
            let _ = writeln!(text, "note: {note}");
        }
        text
    }
}

impl PositionComparison {
    /// `error` as a multiple of the tolerance, or against a bit-exact check.
    fn times_tolerance(&self, error: f64) -> String {
        if self.rtol > 0.0 {
            format!("{:.2}x the tolerance", error / self.rtol)
        } else if error == 0.0 {
            "bit-identical".to_owned()
        } else {
            "not bit-identical".to_owned()
        }
    }
}

fn describe_place(difference: &RowDifference, batch: bool) -> String {
    if batch {
        format!(
            "batch row {} position {} (column {})",
            difference.actual_place.sequence,
            difference.place.position,
            difference.actual_place.position
        )
    } else if difference.place.sequence > 0 {
        format!(
            "sequence {} position {}",
            difference.place.sequence, difference.place.position
        )
    } else {
        format!("position {}", difference.place.position)
    }
}
