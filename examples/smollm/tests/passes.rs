//! The batch path on the real SmolLM2 weights as shipped (quantized), plain candle (no
//! tracing): a left-padded batch gives each row the greedy tokens and (within [`FLOOR`]) the
//! prefill logits of its prompt alone, and a pass that does not continue the batch's padding
//! is an error. Missing weights fail the tests (never skip): run `scripts/fetch-models` first.
//! The relations traced stage by stage, on the dequantized weights where their floor is f32
//! rounding, are `tests/consistency.rs` and `tests/consistency_bugs.rs`.
//!
//! The floor here is not float rounding. candle's f32 matmul (the `gemm` crate) rounds a row of
//! `q·kᵀ` differently with other row and column counts (a few units in the last place), and the
//! next quantized matmul quantizes its input to 8 bits (Q8_1 blocks of 32): mostly the same
//! integers, so the layer's output is bit-identical, but now and then a value on a rounding
//! edge moves one step (1/127 of its block's largest), and from that layer on the two paths
//! differ by a quantization step, not by rounding. Measured on the first 40 tokens of
//! `LICENSE-APACHE`, all 78 splits (`DecodeFrom(1..40)`, `Chunks(1..40)`): 29 bit-identical to
//! the one pass, the others 2e-3 to 4.2e-2 relative to the largest logit, none in between,
//! the argmax the same in all.

use candle_core::Tensor;
use smollm::generate::{greedy, load};
use smollm::passes::greedy_batch;
use smollm::{Batch, GgufTokenizer, Model};

/// How far a split's logits may be from the whole pass's, relative to the largest logit: a
/// quantization step or two of the activations (see the module's docs), twice the largest
/// measured.
const FLOOR: f32 = 0.1;

fn model() -> (Model, GgufTokenizer) {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

/// `max |a - b| / max |a|`: the error relative to the largest of `a` (the reference).
fn relative_error(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    worst / scale
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Rust is a programming language that",
    "Hi",
];
/// Greedy tokens a row.
const STEPS: usize = 6;

#[test]
fn a_padded_batch_gives_each_row_the_tokens_of_its_prompt_alone() {
    let (mut model, mut tokenizer) = model();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tokenizer.encode(p).unwrap())
        .collect();
    let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(
        lengths[0] != lengths[1] && lengths[1] != lengths[2],
        "{lengths:?}"
    );

    let pad_id = tokenizer.eos_id;
    let rows = greedy_batch(&mut model, &prompts, pad_id, STEPS).unwrap();
    // Alone, as the batch does: no stop at the end-of-text token.
    tokenizer.eos_id = u32::MAX;
    for (prompt, row) in PROMPTS.iter().zip(&rows) {
        let alone = greedy(&mut model, &tokenizer, prompt, STEPS).unwrap();
        assert_eq!(row, &alone.generated, "{prompt:?}");
    }
}

#[test]
fn a_padded_batchs_prefill_gives_each_row_the_logits_of_its_prompt_alone() {
    let (mut model, tokenizer) = model();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tokenizer.encode(p).unwrap())
        .collect();
    let batch = Batch::left_padded(&prompts, tokenizer.eos_id).unwrap();
    let logits = model.forward_batch(&batch, 0).unwrap();
    assert_eq!(logits.dims(), [3, model.config().vocab_size]);
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = model.forward(prompt, 0).unwrap();
        let error = relative_error(&alone, &logits.get(row).unwrap());
        println!(
            "row {row} (padding {}): relative error {error:.2e}",
            batch.padding()[row]
        );
        assert!(error < FLOOR, "row {row}: relative error {error:e}");
    }
}

#[test]
fn a_pass_that_does_not_continue_the_batchs_padding_is_an_error() {
    let (mut model, _) = model();
    let batch = Batch::left_padded(&[vec![1, 2, 3], vec![4]], 0).unwrap();
    model.forward_batch(&batch, 0).unwrap();
    let other = Batch::new(vec![5, 6], vec![0, 1]).unwrap();
    let error = model.forward_batch(&other, 3).unwrap_err().to_string();
    assert!(error.contains("padded [0, 1]"), "{error}");
    let all_padding = Batch::new(vec![0, 0, 1, 2], vec![2, 0]).unwrap();
    let error = model
        .forward_batch(&all_padding, 0)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("row 0 of the batch is all padding"),
        "{error}"
    );
}
