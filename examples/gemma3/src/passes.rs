//! The same token ids through the model in different passes, for the relations a port must keep
//! with itself (the same tokens computed two ways agree to float rounding): one prefill pass
//! against a prefill and one-token decode steps, or against chunks through the KV cache
//! ([`run_split`]); a batch of left-padded prompts decoded together against each prompt alone
//! ([`greedy_batch`] against [`crate::generate::greedy_ids`]). Every pass goes through
//! [`Model::forward_batch`], the traced one.

use crate::error::{Error, Result};
use crate::model::{argmax, Model};
use crate::tokenizer::GgufTokenizer;
use candle_core::Tensor;

/// How a sequence of token ids is cut into forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every token in one pass.
    Whole,
    /// The first `K` tokens in one pass, then each further token in a pass of its own (teacher
    /// forcing: the given ids, not sampled ones). `K` is at least 1.
    DecodeFrom(usize),
    /// Passes of `C` tokens each (the last one shorter where `C` does not divide the length),
    /// each at its offset through the KV cache. `C` is at least 1.
    Chunks(usize),
}

impl Split {
    /// The lengths of the passes over `len` tokens, in order, or why the split does not fit.
    pub fn pass_lengths(self, len: usize) -> Result<Vec<usize>> {
        if len == 0 {
            return Err(Error::Passes("no tokens to run".into()));
        }
        match self {
            Split::Whole => Ok(vec![len]),
            Split::DecodeFrom(prefill) if prefill == 0 || prefill > len => Err(Error::Passes(
                format!("cannot prefill {prefill} of {len} tokens: the prefill takes 1 to {len}"),
            )),
            Split::DecodeFrom(prefill) => Ok(std::iter::once(prefill)
                .chain(std::iter::repeat_n(1, len - prefill))
                .collect()),
            Split::Chunks(0) => Err(Error::Passes("chunks of 0 tokens".into())),
            Split::Chunks(size) => Ok((0..len)
                .step_by(size)
                .map(|start| size.min(len - start))
                .collect()),
        }
    }
}

/// Runs `tokens` from an empty cache in the passes `split` cuts them into, and returns the
/// logits `[vocab]` after the last token.
pub fn run_split(model: &mut Model, tokens: &[u32], split: Split) -> Result<Tensor> {
    run_passes(model, tokens, split)?
        .pop()
        .ok_or_else(|| Error::Passes("no pass ran".into()))
}

/// [`run_split`] with every pass's logits `[vocab]` (after the pass's last token), in order.
pub fn run_passes(model: &mut Model, tokens: &[u32], split: Split) -> Result<Vec<Tensor>> {
    model.clear_cache();
    let mut position = 0;
    let mut logits = Vec::new();
    for len in split.pass_lengths(tokens.len())? {
        logits.push(model.forward(&tokens[position..position + len], position)?);
        position += len;
    }
    Ok(logits)
}

/// Greedy decoding of a batch, as a server does it: `prompts` left-padded to the longest (with
/// the tokenizer's pad id) and prefilled in one pass, then each decode pass one new token a
/// row, for up to `steps` tokens a row. Returns each row's generated ids, cut after its first
/// stop token (what [`crate::generate::greedy_ids`] returns for the prompt alone); the batch
/// stops when every row has stopped.
pub fn greedy_batch(
    model: &mut Model,
    tokenizer: &GgufTokenizer,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<Vec<Vec<u32>>> {
    let (mut input, pads) = left_padded(prompts, tokenizer.pad_id)?;
    let mut generated = vec![Vec::new(); prompts.len()];
    let mut stopped = vec![false; prompts.len()];
    let mut position = 0;
    for _ in 0..steps {
        let logits = model.forward_batch(&input, &pads, position)?;
        position += input.len() / prompts.len();
        input = (0..prompts.len())
            .map(|row| argmax(&logits.get(row)?))
            .collect::<candle_core::Result<_>>()?;
        for (row, &next) in input.iter().enumerate() {
            if !stopped[row] {
                generated[row].push(next);
                stopped[row] = tokenizer.stop_ids.contains(&next);
            }
        }
        if stopped.iter().all(|&s| s) {
            break;
        }
    }
    Ok(generated)
}

/// `prompts` as one batch's ids, each left-padded with `pad_id` to the longest, and each row's
/// padding.
pub fn left_padded(prompts: &[Vec<u32>], pad_id: u32) -> Result<(Vec<u32>, Vec<usize>)> {
    if let Some(row) = prompts.iter().position(Vec::is_empty) {
        return Err(Error::Passes(format!(
            "prompt {row} of the batch has no tokens"
        )));
    }
    let longest = prompts
        .iter()
        .map(Vec::len)
        .max()
        .ok_or_else(|| Error::Passes("a batch needs at least one prompt".into()))?;
    let pads: Vec<usize> = prompts.iter().map(|p| longest - p.len()).collect();
    let ids = prompts
        .iter()
        .zip(&pads)
        .flat_map(|(prompt, &pad)| std::iter::repeat_n(pad_id, pad).chain(prompt.iter().copied()))
        .collect();
    Ok((ids, pads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cut_the_tokens_into_passes() {
        assert_eq!(Split::Whole.pass_lengths(5).unwrap(), [5]);
        assert_eq!(Split::DecodeFrom(3).pass_lengths(5).unwrap(), [3, 1, 1]);
        assert_eq!(Split::DecodeFrom(5).pass_lengths(5).unwrap(), [5]);
        assert_eq!(Split::Chunks(2).pass_lengths(5).unwrap(), [2, 2, 1]);
        assert_eq!(Split::Chunks(8).pass_lengths(5).unwrap(), [5]);
    }

    #[test]
    fn splits_that_do_not_fit_are_refused_with_the_reason() {
        let message = |split: Split, len| split.pass_lengths(len).unwrap_err().to_string();
        assert_eq!(
            message(Split::DecodeFrom(6), 5),
            "cannot prefill 6 of 5 tokens: the prefill takes 1 to 5"
        );
        assert!(message(Split::DecodeFrom(0), 5).contains("1 to 5"));
        assert_eq!(message(Split::Chunks(0), 5), "chunks of 0 tokens");
        assert_eq!(message(Split::Whole, 0), "no tokens to run");
    }

    #[test]
    fn prompts_are_left_padded_to_the_longest() {
        let (ids, pads) = left_padded(&[vec![5, 6, 7], vec![8], vec![9, 10]], 0).unwrap();
        assert_eq!(ids, [5, 6, 7, 0, 0, 8, 0, 9, 10]);
        assert_eq!(pads, [0, 2, 1]);
        let empty = left_padded(&[vec![5], vec![]], 0).unwrap_err();
        assert_eq!(empty.to_string(), "prompt 1 of the batch has no tokens");
        assert!(left_padded(&[], 0).is_err());
    }
}
