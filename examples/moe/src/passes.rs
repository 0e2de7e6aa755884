//! The passes of one run over given token ids: a prefill of all but the last `decode_steps`
//! ids, then one decode step through the KV cache for each of those, so that the routing of
//! decode steps is traced as well as the prefill's. The ids are given, not generated, so that a
//! reference run on the same ids makes the same passes whatever either side predicts.

use crate::error::{Error, Result};
use crate::model::{argmax, Model};

/// One pass run.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// The position of its first token.
    pub position: usize,
    /// The ids it ran.
    pub ids: Vec<u32>,
    /// The model's most likely next token after it.
    pub next: u32,
}

/// The token ids of each pass: `ids` but its last `decode_steps` in one pass, then those one a
/// pass. Fails unless the prefill keeps at least one id.
pub fn split(ids: &[u32], decode_steps: usize) -> Result<Vec<&[u32]>> {
    if decode_steps >= ids.len() {
        return Err(Error::Tokens(format!(
            "{decode_steps} decode steps need more than {decode_steps} tokens (the prefill \
             runs the others), not {}",
            ids.len()
        )));
    }
    let (prefill, decode) = ids.split_at(ids.len() - decode_steps);
    Ok(std::iter::once(prefill).chain(decode.chunks(1)).collect())
}

/// Runs `ids` as [`split`] cuts them, from position 0.
pub fn run(model: &mut Model, ids: &[u32], decode_steps: usize) -> Result<Vec<Pass>> {
    model.check_tokens(ids, 0)?;
    let mut position = 0;
    let mut passes = Vec::new();
    for chunk in split(ids, decode_steps)? {
        let logits = model.forward(chunk, position)?;
        passes.push(Pass {
            position,
            ids: chunk.to_vec(),
            next: argmax(&logits)?,
        });
        position += chunk.len();
    }
    Ok(passes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_takes_all_but_the_decode_steps() {
        let ids = [5, 6, 7, 8];
        assert_eq!(split(&ids, 2).unwrap(), vec![&[5, 6][..], &[7], &[8]]);
        assert_eq!(split(&ids, 0).unwrap(), vec![&ids[..]]);
        assert!(split(&ids, 4).is_err());
    }
}
