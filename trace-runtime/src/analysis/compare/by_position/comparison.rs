//! The paired rows compared: each row's error, the first past tolerance, each layer's worst,
//! tokens that differ, rows one run lacks; and the comparison in a few lines of text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{Pairing, Place, PositionRows};

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
    /// `‖b − a‖₂ / ‖a‖₂`, estimated ([`Row::relative_error`](crate::Row::relative_error)); 0 for the same bits.
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
