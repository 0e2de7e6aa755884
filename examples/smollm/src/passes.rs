//! The same tokens through the model in different forward passes, for the relations a port must
//! satisfy against itself (to float rounding):
//!
//! - N tokens in one pass, or a prefill of K then N - K one-token decode steps
//!   ([`Split::Whole`] against [`Split::DecodeFrom`]): fixed token ids, not sampled;
//! - a prompt in chunks of C tokens, each a pass at its offset through the KV cache, or whole
//!   ([`Split::Chunks`]);
//! - a batch of prompts, left-padded and decoded together one token a row a pass
//!   ([`greedy_batch`]), or each prompt alone ([`crate::generate::greedy`]).

use crate::batch::Batch;
use crate::generate::Decoder;
use crate::model::{argmax, Model};
use crate::{Error, Result};
use candle_core::Tensor;
use std::fmt;
use std::ops::Range;

/// How a run of tokens is cut into forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every token in one pass.
    Whole,
    /// The first K tokens in one pass, then one token a pass (a decode step).
    DecodeFrom(usize),
    /// Passes of C tokens (the last one of what is left), each at its offset.
    Chunks(usize),
}

impl Split {
    /// The tokens each pass runs, in order, when `len` tokens are cut this way.
    ///
    /// # Errors
    ///
    /// No tokens, a prefill of none or of more than `len` tokens, or chunks of none.
    pub fn passes(self, len: usize) -> Result<Vec<Range<usize>>> {
        let refused = || Error::Split { split: self, len };
        match self {
            _ if len == 0 => Err(refused()),
            Self::Whole => Ok(std::iter::once(0..len).collect()),
            Self::DecodeFrom(prefill) if prefill == 0 || prefill > len => Err(refused()),
            Self::DecodeFrom(prefill) => Ok(std::iter::once(0..prefill)
                .chain((prefill..len).map(|at| at..at + 1))
                .collect()),
            Self::Chunks(0) => Err(refused()),
            Self::Chunks(size) => Ok((0..len)
                .step_by(size)
                .map(|at| at..(at + size).min(len))
                .collect()),
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Whole => write!(f, "one pass"),
            Self::DecodeFrom(prefill) => {
                write!(f, "a prefill of {prefill} then one token a pass")
            }
            Self::Chunks(size) => write!(f, "passes of {size} tokens"),
        }
    }
}

/// Runs `tokens` from position 0 in the passes `split` says, and returns the logits `[vocab]`
/// after the last token. The first pass, at position 0, starts a new sequence: whatever the
/// caches held before is cleared.
///
/// # Errors
///
/// `split` cannot cut `tokens` ([`Split::passes`]), or a pass fails.
pub fn run_split(model: &mut impl Decoder, tokens: &[u32], split: Split) -> Result<Tensor> {
    let mut logits = None;
    for pass in split.passes(tokens.len())? {
        logits = Some(model.forward(&tokens[pass.clone()], pass.start)?);
    }
    logits.ok_or(Error::Split {
        split,
        len: tokens.len(),
    })
}

/// Greedy decoding of `prompts` together, as a server batches them: left-padded with `pad_id`
/// to the longest and prefilled in one pass, then one token a row a pass, `steps` tokens a row
/// (no row stops at its end-of-text token). Returns each row's generated ids.
///
/// Each row computes what the prompt alone computes (to float rounding: its padded row's
/// kernels sum over more, masked keys), so its tokens are those of
/// [`crate::generate::greedy`] on the prompt alone, end-of-text ignored.
///
/// # Errors
///
/// No prompts, an empty one, or a pass fails.
pub fn greedy_batch(
    model: &mut Model,
    prompts: &[Vec<u32>],
    pad_id: u32,
    steps: usize,
) -> Result<Vec<Vec<u32>>> {
    let mut batch = Batch::left_padded(prompts, pad_id)?;
    let mut generated = vec![Vec::with_capacity(steps); prompts.len()];
    let mut position = 0;
    for step in 0..steps {
        let logits = model.forward_batch(&batch, position)?;
        position += batch.columns();
        let next = (0..batch.rows())
            .map(|row| argmax(&logits.get(row)?))
            .collect::<candle_core::Result<Vec<u32>>>()?;
        for (row, &id) in generated.iter_mut().zip(&next) {
            row.push(id);
        }
        if step + 1 < steps {
            batch = batch.continued(next)?;
        }
    }
    Ok(generated)
}

#[cfg(test)]
mod tests {
    use super::Split;

    /// The passes of 5 tokens cut as `split`, as (start, end) pairs.
    fn passes_of_five(split: Split) -> Vec<(usize, usize)> {
        let passes = split.passes(5).unwrap();
        passes.iter().map(|pass| (pass.start, pass.end)).collect()
    }

    #[test]
    fn splits_cut_the_tokens_into_passes_at_their_offsets() {
        assert_eq!(passes_of_five(Split::Whole), [(0, 5)]);
        assert_eq!(
            passes_of_five(Split::DecodeFrom(3)),
            [(0, 3), (3, 4), (4, 5)]
        );
        assert_eq!(passes_of_five(Split::DecodeFrom(5)), [(0, 5)]);
        assert_eq!(passes_of_five(Split::Chunks(2)), [(0, 2), (2, 4), (4, 5)]);
        assert_eq!(passes_of_five(Split::Chunks(8)), [(0, 5)]);
    }

    #[test]
    fn splits_that_cannot_cut_the_tokens_are_errors_that_say_why() {
        for (split, len) in [
            (Split::DecodeFrom(0), 5),
            (Split::DecodeFrom(6), 5),
            (Split::Chunks(0), 5),
            (Split::Whole, 0),
        ] {
            let error = split.passes(len).unwrap_err().to_string();
            assert!(error.contains(&format!("{len} tokens")), "{error}");
            assert!(error.contains(&split.to_string()), "{error}");
        }
    }
}
