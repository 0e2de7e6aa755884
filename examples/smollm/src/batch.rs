//! Batches of left-padded rows: the token ids of one forward pass over several sequences at once,
//! and what the padding means for the rows' positions and for the attention mask.
//!
//! Prompts of different lengths are padded on the left to the longest, so that every row's last
//! column is its last token and one decode pass adds one column to every row. Row `b`, padded
//! with `pad_b` columns, holds its real token at column `c` at position `c - pad_b` (for the
//! rotary embedding), and its queries see only its real keys. A single prompt is a batch of one
//! row without padding, and computes exactly what it computed before batches existed.

use candle_core::{Device, Result, Tensor};

/// The token ids of one forward pass: `rows` rows of as many ids each, one row after another,
/// and each row's left padding in the sequence the pass belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    ids: Vec<u32>,
    padding: Vec<usize>,
}

impl Batch {
    /// One row of `tokens`, without padding.
    pub fn one(tokens: &[u32]) -> Self {
        Self {
            ids: tokens.to_vec(),
            padding: vec![0],
        }
    }

    /// `ids`, one row after another, of rows whose sequences start with `padding[b]` padding
    /// columns (the padding of the whole sequence, not of this pass: a decode step of a padded
    /// batch gives the prefill's padding again).
    ///
    /// # Errors
    ///
    /// No rows, no ids, or ids that do not fill the rows evenly.
    pub fn new(ids: Vec<u32>, padding: Vec<usize>) -> Result<Self> {
        let rows = padding.len();
        if rows == 0 || ids.is_empty() || !ids.len().is_multiple_of(rows) {
            candle_core::bail!(
                "a batch needs rows of as many ids each, not {} ids in {rows} rows",
                ids.len()
            );
        }
        Ok(Self { ids, padding })
    }

    /// `prompts` left-padded with `pad_id` to the longest: the prefill of a batch.
    ///
    /// # Errors
    ///
    /// No prompts, or an empty one.
    pub fn left_padded(prompts: &[Vec<u32>], pad_id: u32) -> Result<Self> {
        if let Some(row) = prompts.iter().position(Vec::is_empty) {
            candle_core::bail!("prompt {row} of the batch has no tokens");
        }
        let columns = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let padding: Vec<usize> = prompts.iter().map(|p| columns - p.len()).collect();
        let mut ids = Vec::with_capacity(columns * prompts.len());
        for (prompt, &pad) in prompts.iter().zip(&padding) {
            ids.extend(std::iter::repeat_n(pad_id, pad));
            ids.extend_from_slice(prompt);
        }
        Self::new(ids, padding)
    }

    /// The next pass of the same sequences: `ids`, one row after another, with this batch's
    /// padding.
    ///
    /// # Errors
    ///
    /// `ids` do not fill this batch's rows evenly.
    pub fn continued(&self, ids: Vec<u32>) -> Result<Self> {
        Self::new(ids, self.padding.clone())
    }

    /// Every id of the pass, row after row (padding ids included).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Row `row`'s ids in this pass.
    pub fn row(&self, row: usize) -> &[u32] {
        let columns = self.columns();
        &self.ids[row * columns..(row + 1) * columns]
    }

    pub fn rows(&self) -> usize {
        self.padding.len()
    }

    /// Columns of this pass: ids per row.
    pub fn columns(&self) -> usize {
        self.ids.len() / self.rows()
    }

    /// Each row's padding columns at the start of its sequence.
    pub fn padding(&self) -> &[usize] {
        &self.padding
    }

    /// Where this pass's columns sit when its first column is column `start` of the sequences.
    pub fn columns_at(&self, start: usize) -> Columns<'_> {
        Columns {
            start,
            padding: &self.padding,
        }
    }
}

/// Where the columns of one forward pass sit in the rows of its batch: the column of the pass's
/// first one (`start`, the same in every row: the pass's `position`) and each row's left padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns<'a> {
    pub start: usize,
    pub padding: &'a [usize],
}

impl Columns<'static> {
    /// One row without padding, from column `start` on.
    pub fn unpadded(start: usize) -> Self {
        Self {
            start,
            padding: &[0],
        }
    }
}

impl Columns<'_> {
    /// Whether any row has padding: only then do the rows need positions and a mask of their
    /// own.
    pub fn is_padded(&self) -> bool {
        self.padding.iter().any(|&pad| pad > 0)
    }

    /// The rotary position of each row's `len` columns, row after row, when the pass's columns
    /// are rotated from `offset` on (clean: `start`): row `b`'s column `c` of the pass at
    /// `offset + c - padding[b]`. Padding columns, before their row's first token, are at 0:
    /// their values are never read by a real query.
    pub fn rotary_positions(&self, offset: usize, len: usize) -> Vec<u32> {
        self.padding
            .iter()
            .flat_map(|&pad| (offset..offset + len).map(move |c| c.saturating_sub(pad) as u32))
            .collect()
    }

    /// The additive attention mask `[rows, 1, q_len, k_len]` of a pass of `q_len` columns over
    /// `k_len` cached keys: 0 where query `start + i` of row `b` may see key `j`, -inf
    /// elsewhere.
    ///
    /// A real query sees its row's real keys up to itself: `padding[b] <= j <= start + i`. A
    /// padding query (`start + i < padding[b]`) would see no key at all, and its softmax would
    /// be NaN; it sees its own key alone, so that its (unused) values stay finite.
    pub fn padding_mask(&self, q_len: usize, k_len: usize, device: &Device) -> Result<Tensor> {
        let start = self.start;
        let mask: Vec<f32> = self
            .padding
            .iter()
            .flat_map(|&pad| {
                (start..start + q_len).flat_map(move |query| {
                    (0..k_len).map(move |key| {
                        let visible = if query < pad {
                            key == query
                        } else {
                            pad <= key && key <= query
                        };
                        if visible {
                            0.0
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                })
            })
            .collect();
        Tensor::from_vec(mask, (self.padding.len(), 1, q_len, k_len), device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_padded_on_the_left_to_the_longest() {
        let batch = Batch::left_padded(&[vec![5, 6, 7], vec![8], vec![9, 10]], 0).unwrap();
        assert_eq!((batch.rows(), batch.columns()), (3, 3));
        assert_eq!(batch.padding(), [0, 2, 1]);
        assert_eq!(batch.ids(), [5, 6, 7, 0, 0, 8, 0, 9, 10]);
        assert_eq!(batch.row(1), [0, 0, 8]);
        let next = batch.continued(vec![1, 2, 3]).unwrap();
        assert_eq!((next.columns(), next.padding()), (1, &[0, 2, 1][..]));
    }

    #[test]
    fn a_batch_refuses_empty_prompts_and_ragged_rows() {
        let error = Batch::left_padded(&[vec![1], vec![]], 0).unwrap_err();
        assert!(error.to_string().contains("prompt 1"), "{error}");
        assert!(Batch::left_padded(&[], 0).is_err());
        assert!(Batch::new(vec![1, 2, 3], vec![0, 0]).is_err());
    }

    #[test]
    fn rotary_positions_subtract_each_rows_padding() {
        let padding = [0, 2];
        let columns = Columns {
            start: 0,
            padding: &padding,
        };
        assert_eq!(columns.rotary_positions(0, 3), [0, 1, 2, 0, 0, 0]);
        let decode = Columns {
            start: 3,
            padding: &padding,
        };
        assert_eq!(decode.rotary_positions(3, 1), [3, 1]);
    }

    #[test]
    fn the_mask_hides_padding_keys_and_the_future_and_lets_padding_see_itself() {
        let padding = [0, 2];
        let columns = Columns {
            start: 0,
            padding: &padding,
        };
        let mask = columns
            .padding_mask(3, 3, &Device::Cpu)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(mask[0], [[0.0, inf, inf], [0.0, 0.0, inf], [0.0, 0.0, 0.0]]);
        assert_eq!(mask[1], [[0.0, inf, inf], [inf, 0.0, inf], [inf, inf, 0.0]]);
    }
}
