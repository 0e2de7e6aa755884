//! Gemma's tokenizer, read from the GGUF (`tokenizer.ggml.model = "llama"`): SentencePiece's
//! BPE, which merges the adjacent pair whose merged piece scores highest until no pair is a
//! piece, with spaces written `▁` and bytes outside the vocabulary as `<0xXX>` pieces. The same
//! algorithm as llama.cpp's `llm_tokenizer_spm`.
//!
//! Not implemented: splitting the text on the vocabulary's user-defined and control pieces
//! first (`<start_of_turn>` in a prompt is tokenized as plain text, not as its one id).

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// `tokenizer.ggml.token_type`'s value for control pieces (`<bos>`, `<eos>`), never decoded.
const CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type`'s value for byte pieces (`<0x0A>`).
const BYTE: i64 = 6;
/// SentencePiece's stand-in for a space.
const SPACE: char = '\u{2581}';

pub struct GgufTokenizer {
    pieces: Vec<String>,
    scores: Vec<f32>,
    kinds: Vec<i64>,
    ids: HashMap<String, u32>,
    /// The id of each byte's `<0xXX>` piece.
    byte_ids: Vec<Option<u32>>,
    pub bos_id: u32,
    /// The ids that end a generation: `<eos>`, and `<end_of_turn>` where the vocabulary has it
    /// (as transformers' generation config for Gemma 3 lists both).
    pub stop_ids: Vec<u32>,
    /// The id that left-pads the shorter prompts of a batch (`tokenizer.ggml.padding_token_id`,
    /// else 0): any id would do, since the mask hides padding, but a trace shows this one.
    pub pad_id: u32,
    add_bos: bool,
    add_space_prefix: bool,
}

impl GgufTokenizer {
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let model = gguf.string("tokenizer.ggml.model")?;
        if model != "llama" {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.model is {model:?}; only SentencePiece (\"llama\") is implemented"
            )));
        }
        let pieces = gguf.strings("tokenizer.ggml.tokens")?;
        let scores = gguf.floats("tokenizer.ggml.scores")?;
        let kinds = gguf.integers("tokenizer.ggml.token_type")?;
        if scores.len() != pieces.len() || kinds.len() != pieces.len() {
            return Err(Error::Tokenizer(format!(
                "{} pieces, {} scores and {} token types",
                pieces.len(),
                scores.len(),
                kinds.len()
            )));
        }
        let ids: HashMap<String, u32> = pieces
            .iter()
            .enumerate()
            .map(|(id, piece)| (piece.clone(), id as u32))
            .collect();
        let byte_ids = (0..=255u8)
            .map(|b| ids.get(&format!("<0x{b:02X}>")).copied())
            .collect();
        let id = |key: &str| -> Result<u32> {
            let id = gguf.usize(key)?;
            u32::try_from(id)
                .ok()
                .filter(|&id| (id as usize) < pieces.len())
                .ok_or_else(|| Error::Tokenizer(format!("{key} is {id}, not a token id")))
        };
        let mut stop_ids = vec![id("tokenizer.ggml.eos_token_id")?];
        stop_ids.extend(ids.get("<end_of_turn>").copied());
        Ok(Self {
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            stop_ids,
            pad_id: match gguf.value("tokenizer.ggml.padding_token_id") {
                Ok(_) => id("tokenizer.ggml.padding_token_id")?,
                Err(_) => 0,
            },
            add_bos: gguf.bool("tokenizer.ggml.add_bos_token").unwrap_or(true),
            add_space_prefix: gguf
                .bool("tokenizer.ggml.add_space_prefix")
                .unwrap_or(false),
            pieces,
            scores,
            kinds,
            ids,
            byte_ids,
        })
    }

    /// The ids of `text`, `<bos>` first when the GGUF asks for it (Gemma does).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.push(self.bos_id);
        }
        if text.is_empty() {
            return Ok(ids);
        }
        let mut escaped = String::with_capacity(text.len() + 3);
        if self.add_space_prefix {
            escaped.push(SPACE);
        }
        escaped.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        for symbol in self.merge(&escaped) {
            match self.ids.get(symbol) {
                Some(&id) => ids.push(id),
                // A piece the merges never made is one character; its bytes have pieces.
                None => {
                    for byte in symbol.bytes() {
                        let id = self.byte_ids[usize::from(byte)].ok_or_else(|| {
                            Error::Tokenizer(format!(
                                "{symbol:?} is not in the vocabulary and byte 0x{byte:02X} has \
                                 no piece"
                            ))
                        })?;
                        ids.push(id);
                    }
                }
            }
        }
        Ok(ids)
    }

    /// `text` cut into the pieces SentencePiece's BPE merges it into: start from its characters,
    /// repeatedly merge the adjacent pair whose concatenation is the best-scoring piece (the
    /// leftmost on ties).
    fn merge<'t>(&self, text: &'t str) -> Vec<&'t str> {
        // Each symbol is a byte range of `text`, linked to its live neighbours.
        struct Symbol {
            start: usize,
            len: usize,
            prev: Option<usize>,
            next: Option<usize>,
        }
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = i.checked_sub(1);
            symbol.next = (i + 1 < n).then_some(i + 1);
        }
        let mut queue = BinaryHeap::new();
        let candidate = |symbols: &[Symbol], left: usize, right: usize| {
            let (start, len) = (symbols[left].start, symbols[left].len + symbols[right].len);
            let id = *self.ids.get(&text[start..start + len])?;
            Some(Pair {
                score: self.scores[id as usize],
                left,
                right,
                len,
            })
        };
        for i in 1..n {
            queue.extend(candidate(&symbols, i - 1, i));
        }
        while let Some(pair) = queue.pop() {
            let (left, right) = (&symbols[pair.left], &symbols[pair.right]);
            // A pair whose symbols have changed since it was queued is stale.
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            let next = right.next;
            symbols[pair.left].len = pair.len;
            symbols[pair.left].next = next;
            symbols[pair.right].len = 0;
            if let Some(next) = next {
                symbols[next].prev = Some(pair.left);
            }
            if let Some(prev) = symbols[pair.left].prev {
                queue.extend(candidate(&symbols, prev, pair.left));
            }
            if let Some(next) = next {
                queue.extend(candidate(&symbols, pair.left, next));
            }
        }
        let mut pieces = Vec::new();
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            let symbol = &symbols[i];
            pieces.push(&text[symbol.start..symbol.start + symbol.len]);
            at = symbol.next;
        }
        pieces
    }

    /// The text of `ids`, control pieces (`<bos>`, `<eos>`) left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self
                .pieces
                .get(id as usize)
                .ok_or_else(|| Error::Tokenizer(format!("no token with id {id}")))?;
            match self.kinds[id as usize] {
                CONTROL => {}
                BYTE => match u8::from_str_radix(
                    piece.trim_start_matches("<0x").trim_end_matches('>'),
                    16,
                ) {
                    Ok(byte) => bytes.push(byte),
                    Err(_) => {
                        return Err(Error::Tokenizer(format!(
                            "byte piece {piece:?} is not <0xXX>"
                        )))
                    }
                },
                _ => bytes.extend(piece.replace(SPACE, " ").bytes()),
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The piece of `id` as the vocabulary writes it (`▁Paris`).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }
}

/// A merge candidate: the queue pops the best score first, the leftmost on ties.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged piece, to tell a stale candidate from a live one.
    len: usize,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
