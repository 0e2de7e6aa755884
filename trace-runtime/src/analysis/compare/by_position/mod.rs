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

//!
//! Indexing a run's rows is this file's; `pairing` lines sequences up (a batch row with its
//! prompt alone), `comparison` compares the paired rows and says what it found.
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

mod comparison;
mod pairing;

pub use comparison::{compare_rows, PositionComparison, RowDifference, TokenMismatch};
pub use pairing::{pair_batch, pair_sequences, Overlap, Pairing, PositionError};

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
