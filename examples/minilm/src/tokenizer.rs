//! The model's own `tokenizer.json`, with padding turned off: the file pads every input to 128
//! tokens, which would change nothing in the embedding but bury the attention maps in `[PAD]`.

use std::path::Path;

use candle_core::{Device, Tensor};
use tokenizers::Tokenizer;

use crate::{Error, Result};

pub fn load(path: &Path) -> Result<Tokenizer> {
    let mut tokenizer = Tokenizer::from_file(path)
        .map_err(|e| Error::Tokenizer(format!("cannot load {}: {e}", path.display())))?;
    // Truncation stays as configured (128 tokens, longest first).
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// One tokenized sentence.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub tokens: Vec<String>,
    pub mask: Vec<u32>,
}

impl Encoded {
    /// `[1, seq]` token ids and `[1, seq]` attention mask, as `Model::forward` takes them.
    pub fn to_tensors(&self, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let ids = Tensor::new(self.ids.as_slice(), device)?.unsqueeze(0)?;
        let mask = Tensor::new(self.mask.as_slice(), device)?.unsqueeze(0)?;
        Ok((ids, mask))
    }
}

pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Encoded> {
    let encoding = tokenizer
        .encode(text, true)
        .map_err(|e| Error::Tokenizer(format!("cannot encode {text:?}: {e}")))?;
    Ok(Encoded {
        ids: encoding.get_ids().to_vec(),
        tokens: encoding.get_tokens().to_vec(),
        mask: encoding.get_attention_mask().to_vec(),
    })
}
