//! The rows of a forward pass: B sequences side by side, each left-padded to the longest, as a
//! server batches prompts. A pass covers the same columns of every row; what differs from row to
//! row is where its real tokens start, and so each token's rotary position and the keys it may
//! see. A single prompt is a batch of one with no padding.
//!
//! Row `b`'s column `c` holds its token at position `c - pads[b]`; the columns before
//! `pads[b]` are padding: their ids and values mean nothing, and no real query sees their keys.

use candle_core::{Device, Result, Tensor};

/// Where a pass's columns sit: the column of its first token (the same for every row) and each
/// row's left padding (how many columns before its first real token).
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// The column of the pass's first token: the number of columns already in the KV cache.
    pub first_column: usize,
    /// Each row's padding, one entry a row.
    pub pads: &'a [usize],
}

impl Rows<'_> {
    /// How many rows the pass has.
    pub fn count(&self) -> usize {
        self.pads.len()
    }

    /// Whether a pass of `seq_len` columns is a decode step: one new token after others.
    pub fn is_decode(&self, seq_len: usize) -> bool {
        seq_len == 1 && self.first_column > 0
    }

    /// The rotary position of each row's first column in this pass, `first_column - pad` (negative
    /// while the row is still in its padding).
    pub fn rotary_starts(&self) -> Vec<isize> {
        self.pads
            .iter()
            .map(|&pad| self.first_column as isize - pad as isize)
            .collect()
    }
}

/// The attention mask of a pass, `[rows, 1, q_len, k_len]`: 0 where query `first_column + i` of
/// row `b` may see key column `j`, -inf elsewhere; `None` when every query sees every key.
///
/// A real query sees the real keys at or before it and, with a `window`, fewer than `window`
/// positions back (the window counts positions, and a row's positions and columns differ by
/// the same padding). A padding query sees its own key alone: a row of -inf would turn its
/// softmax into NaN, and its values are never read by a real query.
///
/// `pads` is the padding the mask is built from, one entry a row: the rows' own, except where a
/// bug hands it another row's.
pub fn mask(
    first_column: usize,
    q_len: usize,
    k_len: usize,
    window: Option<usize>,
    pads: &[usize],
    device: &Device,
) -> Result<Option<Tensor>> {
    let visible = |pad: usize, i: usize, j: usize| {
        let query = first_column + i;
        if query < pad {
            return j == query;
        }
        pad <= j && j <= query && window.is_none_or(|w| query - j < w)
    };
    let all_visible = pads
        .iter()
        .all(|&pad| (0..q_len).all(|i| (0..k_len).all(|j| visible(pad, i, j))));
    if all_visible {
        return Ok(None);
    }
    let mask: Vec<f32> = pads
        .iter()
        .flat_map(|&pad| {
            (0..q_len).flat_map(move |i| {
                (0..k_len).map(move |j| {
                    if visible(pad, i, j) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
        })
        .collect();
    Tensor::from_vec(mask, (pads.len(), 1, q_len, k_len), device).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row `row` of the mask as booleans: `true` where the key is visible.
    fn visible(mask: &Tensor, row: usize) -> Vec<Vec<bool>> {
        mask.get(row)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .into_iter()
            .map(|row| row.into_iter().map(|v| v == 0.0).collect())
            .collect()
    }

    #[test]
    fn the_mask_is_causal_and_a_window_hides_keys_that_far_back() {
        let cpu = &Device::Cpu;
        // Three queries at positions 2, 3, 4 over keys 0..5.
        let causal = mask(2, 3, 5, None, &[0], cpu).unwrap().unwrap();
        assert_eq!(
            visible(&causal, 0),
            [
                [true, true, true, false, false],
                [true, true, true, true, false],
                [true, true, true, true, true],
            ]
        );
        let window = mask(2, 3, 5, Some(2), &[0], cpu).unwrap().unwrap();
        assert_eq!(
            visible(&window, 0),
            [
                [false, true, true, false, false],
                [false, false, true, true, false],
                [false, false, false, true, true],
            ]
        );
    }

    #[test]
    fn no_mask_where_every_key_is_visible() {
        let cpu = &Device::Cpu;
        // A decode step sees every cached key, unless the window is shorter than the cache.
        assert!(mask(7, 1, 8, None, &[0], cpu).unwrap().is_none());
        assert!(mask(7, 1, 8, Some(8), &[0], cpu).unwrap().is_none());
        let window = mask(7, 1, 8, Some(7), &[0], cpu).unwrap().unwrap();
        assert_eq!(
            visible(&window, 0),
            [[false, true, true, true, true, true, true, true]]
        );
    }

    #[test]
    fn padding_keys_are_hidden_and_a_padding_query_sees_its_own_key() {
        let cpu = &Device::Cpu;
        // Two rows of four columns; the second padded by two.
        let both = mask(0, 4, 4, None, &[0, 2], cpu).unwrap().unwrap();
        assert_eq!(both.dims(), [2, 1, 4, 4]);
        assert_eq!(
            visible(&both, 0),
            [
                [true, false, false, false],
                [true, true, false, false],
                [true, true, true, false],
                [true, true, true, true],
            ]
        );
        assert_eq!(
            visible(&both, 1),
            [
                [true, false, false, false],
                [false, true, false, false],
                [false, false, true, false],
                [false, false, true, true],
            ]
        );
        // A decode step of the padded row: its padding keys stay hidden; the window counts
        // from the query back, as in an unpadded row.
        let step = mask(4, 1, 5, Some(2), &[0, 2], cpu).unwrap().unwrap();
        assert_eq!(visible(&step, 1), [[false, false, false, true, true]]);
    }

    #[test]
    fn rotary_starts_subtract_each_rows_padding() {
        let rows = Rows {
            first_column: 3,
            pads: &[0, 2, 5],
        };
        assert_eq!(rows.rotary_starts(), [3, 1, -2]);
        assert_eq!(rows.count(), 3);
        assert!(rows.is_decode(1));
        assert!(!rows.is_decode(2));
        let prefill = Rows {
            first_column: 0,
            pads: &[0],
        };
        assert!(!prefill.is_decode(1));
    }
}
