//! Loading and greedy decoding, shared by the CLI and the tests. [`crate::passes`] runs the same
//! ids in other passes and as a batch.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::{argmax, Model};
use crate::passes::{run_split, Split};
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
    greedy_ids(model, tokenizer, prompt_ids, Split::Whole, max_tokens)
}

/// Greedy decoding of up to `max_tokens` tokens after `prompt_ids`, the prompt run in the
/// passes of `split` (see [`run_split`]), then one pass a generated token; stops after a stop
/// token. With `max_tokens` 0 nothing runs.
pub fn greedy_ids(
    model: &mut Model,
    tokenizer: &GgufTokenizer,
    prompt_ids: Vec<u32>,
    split: Split,
    max_tokens: usize,
) -> Result<Generation> {
    let mut generation = Generation {
        text: String::new(),
        prompt_ids,
        generated: Vec::new(),
        stopped: false,
        prefill_lens_top: Vec::new(),
    };
    if max_tokens == 0 {
        return Ok(generation);
    }
    let mut logits = run_split(model, &generation.prompt_ids, split)?;
    generation.prefill_lens_top = model
        .lens_logits()?
        .iter()
        .map(argmax)
        .collect::<candle_core::Result<_>>()?;
    let mut position = generation.prompt_ids.len();
    loop {
        let next = argmax(&logits)?;
        generation.generated.push(next);
        if tokenizer.stop_ids.contains(&next) {
            generation.stopped = true;
            break;
        }
        if generation.generated.len() == max_tokens {
            break;
        }
        logits = model.forward(&[next], position)?;
        position += 1;
    }
    generation.text = tokenizer.decode(&generation.generated)?;
    Ok(generation)
}
