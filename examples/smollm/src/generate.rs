//! Loading and greedy decoding, shared by the CLI and the tests.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::{argmax, Model};
use crate::passes::{run_split, Split};
use crate::pipeline::Pipeline;
use crate::tokenizer::GgufTokenizer;
use candle_core::Tensor;
use std::path::Path;
use std::time::{Duration, Instant};

/// The model and its tokenizer from one GGUF file (read once).
pub fn load(path: &Path) -> Result<(Model, GgufTokenizer)> {
    let mut gguf = Gguf::open(path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
    let model = Model::from_gguf(&mut gguf)?;
    Ok((model, tokenizer))
}

pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// Generated ids, the EOS token included if it was produced.
    pub generated: Vec<u32>,
    /// The generated text alone, special tokens dropped.
    pub text: String,
    pub stopped_at_eos: bool,
    /// The prompt's passes: one, unless [`greedy_split`] cut it into several.
    pub prefill: Duration,
    /// One entry per single-token forward pass after the prefill.
    pub decode_steps: Vec<Duration>,
    /// With the logit lens on: each layer's top token for the first generated token.
    pub prefill_lens_top: Vec<u32>,
}

impl Generation {
    /// Median time of a single-token decode step; None when there was none.
    pub fn median_decode(&self) -> Option<Duration> {
        let mut steps = self.decode_steps.clone();
        steps.sort();
        match steps.len() {
            0 => None,
            n if n % 2 == 1 => Some(steps[n / 2]),
            n => Some((steps[n / 2 - 1] + steps[n / 2]) / 2),
        }
    }

    /// The fastest decode step: on a machine shared with other work, load only ever adds time,
    /// so this is the steadiest figure to compare builds by.
    pub fn fastest_decode(&self) -> Option<Duration> {
        self.decode_steps.iter().min().copied()
    }
}

/// The prompt's token ids; an error when it encodes to none (there would be nothing to run).
pub fn encode_prompt(tokenizer: &GgufTokenizer, prompt: &str) -> Result<Vec<u32>> {
    let prompt_ids = tokenizer.encode(prompt)?;
    if prompt_ids.is_empty() {
        return Err(Error::Tokenizer("the prompt encodes to no tokens".into()));
    }
    Ok(prompt_ids)
}

/// What greedy decoding runs: the model on the calling thread ([`Model`]) or cut into stages on
/// threads of their own ([`Pipeline`]); both compute the same logits.
pub trait Decoder {
    /// Runs `tokens`, the sequence's tokens from `position` on, and returns the logits `[vocab]`
    /// for the token after the last one; `position == 0` starts a new sequence.
    fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor>;

    /// The logit lens of the last forward pass: one `[vocab]` tensor per layer, empty without it.
    fn lens_logits(&self) -> Result<Vec<Tensor>>;
}

impl Decoder for Model {
    fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor> {
        Ok(Model::forward(self, tokens, position)?)
    }

    fn lens_logits(&self) -> Result<Vec<Tensor>> {
        Ok(Model::lens_logits(self)?)
    }
}

impl Decoder for Pipeline {
    fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Tensor> {
        Ok(Pipeline::forward(self, tokens, position)?)
    }

    /// A pipeline has no logit lens.
    fn lens_logits(&self) -> Result<Vec<Tensor>> {
        Ok(Vec::new())
    }
}

/// Greedy decoding: the prompt in one forward pass, then one token per pass through the KV cache,
/// until `max_tokens` tokens or EOS.
pub fn greedy(
    model: &mut impl Decoder,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_tokens: usize,
) -> Result<Generation> {
    let prompt_ids = encode_prompt(tokenizer, prompt)?;
    greedy_split(model, tokenizer, prompt_ids, Split::Whole, max_tokens)
}

/// Greedy decoding of `prompt_ids`, run in the passes `split` says (the prefill), then one token
/// per pass through the KV cache, until `max_tokens` tokens or EOS. [`greedy`] is this with the
/// prompt in one pass; whichever the split, the tokens are the same (to float rounding).
pub fn greedy_split(
    model: &mut impl Decoder,
    tokenizer: &GgufTokenizer,
    prompt_ids: Vec<u32>,
    split: Split,
    max_tokens: usize,
) -> Result<Generation> {
    let mut generation = Generation {
        prompt_ids,
        generated: Vec::new(),
        text: String::new(),
        stopped_at_eos: false,
        prefill: Duration::ZERO,
        decode_steps: Vec::new(),
        prefill_lens_top: Vec::new(),
    };
    if max_tokens == 0 {
        return Ok(generation);
    }
    let started = Instant::now();
    let mut logits = run_split(model, &generation.prompt_ids, split)?;
    generation.prefill = started.elapsed();
    for lens in model.lens_logits()? {
        generation.prefill_lens_top.push(argmax(&lens)?);
    }
    let mut position = generation.prompt_ids.len();
    loop {
        let next = argmax(&logits)?;
        generation.generated.push(next);
        if next == tokenizer.eos_id {
            generation.stopped_at_eos = true;
            break;
        }
        if generation.generated.len() >= max_tokens {
            break;
        }
        let started = Instant::now();
        logits = model.forward(&[next], position)?;
        generation.decode_steps.push(started.elapsed());
        position += 1;
    }
    generation.text = tokenizer.decode(&generation.generated)?;
    Ok(generation)
}
