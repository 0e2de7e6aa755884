//! The model loaded, and the ways the relations run it: the same token ids in one pass, as a
//! prefill and decode steps, or in chunks ([`Gemma3::run_split`]); the prompts of a [`Batch`]
//! together ([`Gemma3::run_batch`]) and each alone ([`Gemma3::run_alone`]). Token ids are fixed,
//! never sampled, so that both sides of a relation compute the same text.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle::{Device, Tensor};

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::quantized_gemma3::ModelWeights;
use crate::tokenizer::GgufTokenizer;

/// The text the relations run: model-trace's `LICENSE-APACHE`, fixed at compile time.
pub const LICENSE_APACHE: &str = include_str!("../../../../LICENSE-APACHE");

/// The variable candle reads, once per thread, when a thread first makes a `QMatMul`: set
/// (non-empty, not `0`), the matrix products dequantize their weights to f32.
const DEQUANTIZE_ALL: &str = "CANDLE_DEQUANTIZE_ALL";

/// How the model's matrix products hold their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// As the GGUF stores them (Q4_K, Q5_0, Q6_K, Q8_0): candle quantizes each product's
    /// input rows to 8 bits (Q8_K, Q8_0) and multiplies in integers. What a user runs.
    Quantized,
    /// Dequantized to f32 at load time, every product in f32 (candle's `CANDLE_DEQUANTIZE_ALL`):
    /// the same model without the quantization of the activations, whose rounding steps
    /// amplify rounding differences (see the README), and 13 times faster here on a CPU.
    Dequantized,
}

impl Weights {
    /// Runs `load` in a thread of its own with `CANDLE_DEQUANTIZE_ALL` set for these weights,
    /// so that candle reads it afresh; the variable is restored afterwards. Setting it is not
    /// synchronised with other threads reading the environment: load before starting any.
    fn while_loading<T: Send>(self, load: impl FnOnce() -> candle::Result<T> + Send) -> Result<T> {
        let before = std::env::var_os(DEQUANTIZE_ALL);
        let value = match self {
            Weights::Quantized => "0",
            Weights::Dequantized => "1",
        };
        std::env::set_var(DEQUANTIZE_ALL, value);
        let loaded = std::thread::scope(|scope| scope.spawn(load).join());
        match before {
            Some(before) => std::env::set_var(DEQUANTIZE_ALL, before),
            None => std::env::remove_var(DEQUANTIZE_ALL),
        }
        match loaded {
            Ok(model) => Ok(model?),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// candle-transformers' quantized Gemma 3 (the annotated copy) with the GGUF's tokenizer, on
/// the CPU.
pub struct Gemma3 {
    model: ModelWeights,
    tokenizer: GgufTokenizer,
    device: Device,
}

impl Gemma3 {
    /// Loads the GGUF at `path`, its weights as `weights` says.
    pub fn load(path: &Path, weights: Weights) -> Result<Self> {
        let gguf = Gguf::open(path)?;
        let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
        let Gguf { content, .. } = gguf;
        let device = Device::Cpu;
        let mut reader = BufReader::new(File::open(path)?);
        let model =
            weights.while_loading(|| ModelWeights::from_gguf(content, &mut reader, &device))?;
        Ok(Self {
            model,
            tokenizer,
            device,
        })
    }

    /// Loads the GGUF from model-trace's model cache ([`find_gguf`](crate::weights::find_gguf)).
    pub fn load_cached(weights: Weights) -> Result<Self> {
        Self::load(&crate::weights::find_gguf()?, weights)
    }

    /// The first `n` token ids of [`LICENSE_APACHE`], `<bos>` first.
    pub fn license_tokens(&self, n: usize) -> Result<Vec<u32>> {
        let ids = self.tokenizer.encode(LICENSE_APACHE)?;
        if ids.len() < n {
            return Err(Error::Input(format!(
                "LICENSE-APACHE is {} tokens, fewer than the {n} asked for",
                ids.len()
            )));
        }
        Ok(ids[..n].to_vec())
    }

    /// A [`Batch`] cut from [`LICENSE_APACHE`]'s token ids ([`Batch::cut`]).
    pub fn license_batch(&self, rows: usize, length: usize, steps: usize) -> Result<Batch> {
        let ids = self.tokenizer.encode(LICENSE_APACHE)?;
        Batch::cut(&ids, self.tokenizer.bos_id, rows, length, steps)
    }

    /// `tokens` as passes from position 0: the first of `first` tokens, then `step` tokens a
    /// pass (the last one shorter): `first = tokens.len()` is one pass, `step = 1` decode
    /// steps. Returns the last pass's logits.
    pub fn run_split(&mut self, tokens: &[u32], first: usize, step: usize) -> Result<Tensor> {
        if first == 0 || step == 0 || first > tokens.len() {
            return Err(Error::Input(format!(
                "cannot split {} tokens into a first pass of {first} and passes of {step}",
                tokens.len()
            )));
        }
        let mut logits = self.pass(&tokens[..first], 1, 0)?;
        let mut at = first;
        while at < tokens.len() {
            let end = (at + step).min(tokens.len());
            logits = self.pass(&tokens[at..end], 1, at)?;
            at = end;
        }
        Ok(logits)
    }

    /// Row `row` of `batch` alone: its prompt in one pass, then its decode tokens one a step.
    pub fn run_alone(&mut self, batch: &Batch, row: usize) -> Result<Tensor> {
        let (prompt, decode) = (&batch.prompts[row], &batch.decode[row]);
        self.run_split(&[&prompt[..], decode].concat(), prompt.len(), 1)
    }

    /// `batch`'s prompts prefilled together in one pass, then each row fed its decode tokens,
    /// one a step, all rows in the same pass.
    pub fn run_batch(&mut self, batch: &Batch) -> Result<Tensor> {
        let rows = batch.prompts.len();
        let mut logits = self.pass(&batch.prompts.concat(), rows, 0)?;
        for step in 0..batch.steps() {
            let column: Vec<u32> = batch.decode.iter().map(|row| row[step]).collect();
            logits = self.pass(&column, rows, batch.prompt_length() + step)?;
        }
        Ok(logits)
    }

    /// One forward pass of `ids`, `batch` rows of equal length one after another, at `position`.
    fn pass(&mut self, ids: &[u32], batch: usize, position: usize) -> Result<Tensor> {
        let ids = Tensor::from_slice(ids, (batch, ids.len() / batch), &self.device)?;
        Ok(self.model.forward(&ids, position)?)
    }
}

/// Prompts to run as one batch, each followed by decode steps of fixed tokens. The model has
/// no padding mask: its prompts are of one length, and so are its rows of decode tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    prompts: Vec<Vec<u32>>,
    decode: Vec<Vec<u32>>,
}

impl Batch {
    /// `rows` prompts of `length` tokens, each `<bos>` then the next `length - 1` ids of
    /// `ids[1..]`, and after each prompt's ids the `steps` it is fed one a step: the rows cut
    /// from `ids` one after another, so each row's text differs.
    pub fn cut(ids: &[u32], bos: u32, rows: usize, length: usize, steps: usize) -> Result<Self> {
        let per_row = (length + steps).saturating_sub(1);
        if rows == 0 || length == 0 || per_row == 0 || 1 + rows * per_row > ids.len() {
            return Err(Error::Input(format!(
                "cannot cut {rows} prompts of {length} tokens and {steps} decode steps each \
                 from {} token ids",
                ids.len()
            )));
        }
        let (mut prompts, mut decode) = (Vec::new(), Vec::new());
        for row in ids[1..].chunks_exact(per_row).take(rows) {
            let (prompt, steps) = row.split_at(length - 1);
            prompts.push([&[bos], prompt].concat());
            decode.push(steps.to_vec());
        }
        Ok(Self { prompts, decode })
    }

    /// The prompts.
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// Each row's decode tokens.
    pub fn decode(&self) -> &[Vec<u32>] {
        &self.decode
    }

    /// The tokens of each prompt.
    pub fn prompt_length(&self) -> usize {
        self.prompts.first().map_or(0, Vec::len)
    }

    /// The decode steps.
    pub fn steps(&self) -> usize {
        self.decode.first().map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_cut_from_the_ids_one_row_after_another_each_prompt_bos_first() {
        let ids: Vec<u32> = (100..120).collect();
        let batch = Batch::cut(&ids, 2, 3, 3, 2).unwrap();
        // After ids[0] (the text's own <bos>), rows of 3 - 1 + 2 ids.
        assert_eq!(
            batch.prompts(),
            [vec![2, 101, 102], vec![2, 105, 106], vec![2, 109, 110]]
        );
        assert_eq!(
            batch.decode(),
            [vec![103, 104], vec![107, 108], vec![111, 112]]
        );
        assert_eq!((batch.prompt_length(), batch.steps()), (3, 2));
    }

    #[test]
    fn a_batch_the_ids_cannot_fill_is_an_error_that_says_so() {
        let ids: Vec<u32> = (0..10).collect();
        let error = Batch::cut(&ids, 2, 3, 5, 0).unwrap_err().to_string();
        assert!(
            error.contains("cannot cut 3 prompts of 5 tokens and 0 decode steps each from 10"),
            "{error}"
        );
        assert!(
            Batch::cut(&ids, 2, 3, 1, 0).is_err(),
            "one-token prompts, no steps"
        );
        assert!(Batch::cut(&ids, 2, 0, 2, 1).is_err(), "no rows");
    }
}
