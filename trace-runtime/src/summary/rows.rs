//! A tensor summarised row by row: for each row of its last dimension (a token's hidden state, in
//! a `[batch, seq, hidden]` stage), the L2 norm, the [`Sketch`] and a short [`Fingerprint`].
//!
//! Two runs that computed the same tokens in different forward passes (one prefill against a
//! prefill and decode steps, a prompt whole against in chunks, a batch against each prompt
//! alone) hold the same rows in tensors of different shapes; the whole-tensor statistics of one
//! pass cannot be set against another's, but its rows can, position by position
//! ([`crate::compare::by_position`]). Each row costs nine numbers and sixteen hex digits
//! (about 113 bytes in a trace file) whatever its width, where capturing it would cost its
//! width.

use serde::{Deserialize, Serialize};

use super::{Fingerprint, Sketch};

/// Each row of a tensor's last dimension, summarised ([`RowSummaries::of`]). Written in a
/// trace file as the `rows` of a tensor's summary, when the session records them
/// ([`ModelTracerConfig::row_summaries`](crate::ModelTracerConfig::row_summaries)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RowSummaries {
    /// Values per row: the tensor's last dimension.
    pub width: usize,
    /// The L2 norm of each row's finite values, summed in `f64`.
    #[serde(with = "crate::float::vec")]
    pub norm: Vec<f32>,
    /// Each row's sketch, of the row alone (its element `i` is the row's `i`-th value), so a
    /// row's sketch is the same in a tensor of one row as in a tensor of many.
    pub sketch: Vec<Sketch>,
    /// Each row's [`short`](Fingerprint::short) fingerprint: equal ones are the same bits.
    pub fingerprint: Vec<Fingerprint>,
    /// Rows holding NaN or ±Inf, with how many such values each (left out of the norm and the
    /// sketch); absent when none does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_finite: Vec<(usize, usize)>,
}

impl RowSummaries {
    /// The rows of `values` read as rows of `width` values (`values.len()` must be a multiple
    /// of `width`; a `width` of 0 gives no rows).
    #[must_use]
    pub fn of(values: &[f32], width: usize) -> Self {
        let rows = values.len().checked_div(width).unwrap_or(0);
        let mut summaries = Self {
            width,
            norm: Vec::with_capacity(rows),
            sketch: Vec::with_capacity(rows),
            fingerprint: Vec::with_capacity(rows),
            non_finite: Vec::new(),
        };
        for (index, row) in values.chunks_exact(width.max(1)).take(rows).enumerate() {
            let (sum_of_squares, non_finite) =
                row.iter().fold((0.0f64, 0usize), |(sum, bad), &x| {
                    if x.is_finite() {
                        (sum + f64::from(x) * f64::from(x), bad)
                    } else {
                        (sum, bad + 1)
                    }
                });
            #[allow(clippy::cast_possible_truncation)]
            summaries.norm.push(sum_of_squares.sqrt() as f32);
            summaries.sketch.push(Sketch::of(row));
            summaries
                .fingerprint
                .push(Fingerprint::of_counted(row, non_finite > 0).short());
            if non_finite > 0 {
                summaries.non_finite.push((index, non_finite));
            }
        }
        summaries
    }

    /// The rows of a tensor of `shape`, `[seq, width]` or `[batch, seq, width]`: one a token.
    /// `None` for any other rank, whose token axis cannot be told from the shape (a
    /// `[batch, seq, heads, head_dim]` tensor's rows would be heads, a `[batch, heads, seq,
    /// head_dim]` one's would put heads where the batch is): such tensors are left out of
    /// comparisons by position rather than compared wrongly.
    #[must_use]
    pub fn of_shape(values: &[f32], shape: &[usize]) -> Option<Self> {
        match shape {
            [_, width] | [_, _, width] if *width > 0 => Some(Self::of(values, *width)),
            _ => None,
        }
    }

    /// Rows summarised.
    pub fn len(&self) -> usize {
        self.norm.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.norm.is_empty()
    }

    /// Row `index`: its norm, sketch, fingerprint and count of non-finite values.
    pub fn row(&self, index: usize) -> Option<Row> {
        Some(Row {
            norm: *self.norm.get(index)?,
            sketch: *self.sketch.get(index)?,
            fingerprint: *self.fingerprint.get(index)?,
            // In row order as written; a file out of order finds none (and says 0).
            non_finite: self
                .non_finite
                .binary_search_by_key(&index, |&(row, _)| row)
                .map_or(0, |at| self.non_finite[at].1),
        })
    }

    /// Whether the three lists hold one entry per row each (a file written by hand may not).
    pub fn is_consistent(&self) -> bool {
        self.sketch.len() == self.norm.len() && self.fingerprint.len() == self.norm.len()
    }
}

/// One row of [`RowSummaries`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// The L2 norm of its finite values.
    pub norm: f32,
    /// Its sketch.
    pub sketch: Sketch,
    /// Its short fingerprint.
    pub fingerprint: Fingerprint,
    /// Its NaN and ±Inf values.
    pub non_finite: usize,
}

impl Row {
    /// How far `other` is from this row, relative to this row's norm: `‖other − self‖₂ /
    /// ‖self‖₂`, estimated. 0 when the fingerprints are equal (the same bits); else the larger
    /// of the sketches' estimate (`‖Δsketch‖₂ / √8`, whose square's expectation is
    /// `‖Δ‖₂²`) and the difference of the norms (`|‖a‖ − ‖b‖| ≤ ‖a − b‖`: a bound the estimate
    /// can never fall below). Infinite when one row has non-finite values the other lacks.
    #[must_use]
    pub fn relative_error(&self, other: &Self) -> f64 {
        if self.fingerprint.same_bits(&other.fingerprint) {
            return 0.0;
        }
        if self.non_finite != other.non_finite {
            return f64::INFINITY;
        }
        let sketch_distance = self
            .sketch
            .0
            .iter()
            .zip(other.sketch.0)
            .map(|(&a, b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum::<f64>()
            .sqrt();
        #[allow(clippy::cast_precision_loss)]
        let estimate = sketch_distance / (super::SKETCH_DIM as f64).sqrt();
        let norm_difference = (f64::from(self.norm) - f64::from(other.norm)).abs();
        let distance = estimate.max(norm_difference);
        let scale = f64::from(self.norm);
        if scale > 0.0 {
            distance / scale
        } else if distance > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_the_same_summary_alone_and_among_others() {
        let values: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let whole = RowSummaries::of_shape(&values, &[1, 3, 4]).unwrap();
        assert_eq!(whole.len(), 3);
        let alone = RowSummaries::of(&values[8..12], 4);
        assert_eq!(whole.row(2), alone.row(0));
        assert_eq!(
            whole.row(2).unwrap().relative_error(&alone.row(0).unwrap()),
            0.0
        );
        let norm = values[4..8].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((whole.norm[1] - norm).abs() < 1e-6);
        assert!(RowSummaries::of_shape(&values, &[12]).is_none());
        // A token's row spans its heads: a 4-D tensor's rows are not tokens.
        assert!(RowSummaries::of_shape(&values, &[1, 3, 2, 2]).is_none());
        assert_eq!(RowSummaries::of_shape(&values, &[3, 4]).unwrap().len(), 3);
    }

    #[test]
    fn the_estimated_error_follows_the_true_one() {
        let a: Vec<f32> = (0..512)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let true_norm = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        for scale in [1e-5, 1e-3, 1e-1] {
            let b: Vec<f32> = a
                .iter()
                .enumerate()
                .map(|(i, x)| x + scale * (((i * 31) % 17) as f32 / 8.0 - 1.0))
                .collect();
            let exact = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(y - x).powi(2))
                .sum::<f64>()
                .sqrt()
                / true_norm;
            let (ra, rb) = (RowSummaries::of(&a, 512), RowSummaries::of(&b, 512));
            let estimate = ra.row(0).unwrap().relative_error(&rb.row(0).unwrap());
            assert!(
                estimate > exact / 3.0 && estimate < exact * 3.0,
                "scale {scale}: estimate {estimate:e}, exact {exact:e}"
            );
        }
    }

    #[test]
    fn a_nan_is_counted_apart_and_makes_the_error_infinite() {
        let mut values = vec![1.0f32; 8];
        let clean = RowSummaries::of(&values, 4);
        values[5] = f32::NAN;
        let broken = RowSummaries::of(&values, 4);
        assert_eq!(broken.non_finite, [(1, 1)]);
        assert_eq!(broken.row(1).unwrap().non_finite, 1);
        let error = clean
            .row(1)
            .unwrap()
            .relative_error(&broken.row(1).unwrap());
        assert!(error.is_infinite());
        let json = serde_json::to_string(&broken).unwrap();
        let back: RowSummaries = serde_json::from_str(&json).unwrap();
        assert_eq!(back, broken);
        assert!(!serde_json::to_string(&clean)
            .unwrap()
            .contains("non_finite"));
    }
}
