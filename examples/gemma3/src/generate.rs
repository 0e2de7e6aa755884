//! Loading and greedy decoding, shared by the CLI and the tests.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::{argmax, Model};
use crate::tokenizer::GgufTokenizer;
use std::path::Path;

/// The model and its tokenizer from one GGUF file (read once).
pub fn load(path: &Path) -> Result<(Model, GgufTokenizer)> {
    let mut gguf = Gguf::open(path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
    let model = Model::from_gguf(&mut gguf)?;
    Ok((model, tokenizer))
}

pub struct Generation {
    /// The prompt's ids, `<bos>` first.
    pub prompt_ids: Vec<u32>,
    /// Generated ids, the stop token included if one was produced.
    pub generated: Vec<u32>,
    /// The generated text alone, control tokens dropped.
    pub text: String,
    pub stopped: bool,
    /// With the logit lens on: each layer's top token for the first generated token.
    pub prefill_lens_top: Vec<u32>,
}

/// Greedy decoding of up to `max_tokens` tokens after `prompt`: one forward pass over the
/// prompt, then one a token, each reusing the KV caches; stops after a stop token.
pub fn greedy(
    model: &mut Model,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_tokens: usize,
) -> Result<Generation> {
    let prompt_ids = tokenizer.encode(prompt)?;
    if prompt_ids.is_empty() {
        return Err(Error::Tokenizer("the prompt encodes to no tokens".into()));
    }
    let mut generated = Vec::new();
    let mut prefill_lens_top = Vec::new();
    let mut stopped = false;
    let mut position = 0;
    let mut input = prompt_ids.clone();
    while generated.len() < max_tokens {
        let logits = model.forward(&input, position)?;
        if position == 0 {
            prefill_lens_top = model
                .lens_logits()?
                .iter()
                .map(argmax)
                .collect::<candle_core::Result<_>>()?;
        }
        position += input.len();
        let next = argmax(&logits)?;
        generated.push(next);
        if tokenizer.stop_ids.contains(&next) {
            stopped = true;
            break;
        }
        input = vec![next];
    }
    Ok(Generation {
        text: tokenizer.decode(&generated)?,
        prompt_ids,
        generated,
        stopped,
        prefill_lens_top,
    })
}
