//! Each bug of the decode, cache and batch paths (`gemma3::bugs`) changes the numbers on the
//! path it names and leaves every other path bit for bit as the clean port computes it: what
//! lets a comparison of the port with itself (one pass against decode steps, chunks against
//! the whole, a batch against its rows alone) find it, and find nothing on the clean port.
//!
//! One test: the bug switch is the whole process's.

mod common;

use candle_core::Tensor;
use common::{model, relative_error};
use gemma3::passes::{left_padded, run_passes, run_split, Split};
use gemma3::{GgufTokenizer, Model};

/// 13 tokens, `<bos>` included.
const PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then";
const BATCH: [&str; 3] = [
    "The capital of France is",
    "Water boils at",
    "Once upon a time",
];

/// The paths, in the order [`run_paths`] returns their logits.
const PATHS: [&str; 5] = ["whole", "decode", "chunks", "batch prefill", "batch decode"];

/// Each bug with the paths it must change (the others must stay bit-identical). The window bug
/// shows only from position 511 on, past these prompts: `tests/window_decode.rs` runs there.
const CHANGED: [(&str, [bool; 5]); 8] = [
    (
        "window-decode-one-short",
        [false, false, false, false, false],
    ),
    (
        "rope-decode-position-missing",
        [false, true, false, false, true],
    ),
    (
        "rope-decode-position-twice",
        [false, true, false, false, true],
    ),
    ("kv-cache-off-by-one", [false, true, false, false, true]),
    ("kv-cache-f16", [false, true, true, false, true]),
    ("kv-cache-bf16", [false, true, true, false, true]),
    (
        "batch-rope-ignores-padding",
        [false, false, false, true, true],
    ),
    ("batch-mask-other-row", [false, false, false, true, true]),
];

#[test]
fn each_bug_changes_the_numbers_on_its_path_only() {
    let mut guard = model();
    let (model, tokenizer) = &mut *guard;
    let clean = run_paths(model, tokenizer);
    for (bug, expected) in CHANGED {
        gemma3::bugs::inject_list(bug).unwrap();
        let buggy = run_paths(model, tokenizer);
        gemma3::bugs::inject_list("").unwrap();
        for (path, ((clean, buggy), expected)) in
            PATHS.iter().zip(clean.iter().zip(&buggy).zip(expected))
        {
            let error = relative_error(buggy, clean);
            eprintln!("{bug:30} {path:14} {error:.2e}");
            assert_eq!(error > 0.0, expected, "{bug} on the {path} path: {error:e}");
        }
    }
}

/// The logits of each path of [`PATHS`]: one prefill pass of `PROMPT`; a prefill of 8 of its
/// tokens and one-token steps (every step's logits); chunks of 5; a batch of three prompts,
/// left-padded, prefilled, then one decode step with fixed ids.
fn run_paths(model: &mut Model, tokenizer: &GgufTokenizer) -> [Tensor; 5] {
    let ids = tokenizer.encode(PROMPT).unwrap();
    assert_eq!(ids.len(), 13);
    let whole = run_split(model, &ids, Split::Whole).unwrap();
    let steps = run_passes(model, &ids, Split::DecodeFrom(8)).unwrap();
    let decode = Tensor::stack(&steps, 0).unwrap();
    let chunks = run_split(model, &ids, Split::Chunks(5)).unwrap();
    let prompts: Vec<Vec<u32>> = BATCH.iter().map(|p| tokenizer.encode(p).unwrap()).collect();
    let (batch_ids, pads) = left_padded(&prompts, tokenizer.pad_id).unwrap();
    let columns = batch_ids.len() / prompts.len();
    let batch_prefill = model.forward_batch(&batch_ids, &pads, 0).unwrap();
    let batch_decode = model
        .forward_batch(&[506, 506, 506], &pads, columns)
        .unwrap();
    [whole, decode, chunks, batch_prefill, batch_decode]
}
